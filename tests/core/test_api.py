"""memlib from Python: the README's example runs as written on the bundled sample (so
the README cannot drift from the API), ``memlib.open_store`` answers as the command line does, a
bad request is the service's typed error, ``import memlib`` stays cheap, and forgetting works
from a published store without its input. One store is built per module (the README's own build)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.conftest import published_text, run_cli

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "memlib" / "data" / "sample_conversations.jsonl"


def readme_python() -> str:
    """The fenced python block of the README's "From Python" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## From Python"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory) -> tuple[Path, dict]:
    """The README's example executed in a fresh directory: (that directory, its variables)."""
    where = tmp_path_factory.mktemp("readme")
    before = Path.cwd()
    os.chdir(where)
    try:
        names: dict = {}
        exec(compile(readme_python(), "README.md", "exec"), names)  # noqa: S102 - the README's own code
    finally:
        os.chdir(before)
    return where, names


def test_the_readme_example_runs_as_written(readme_run):
    where, names = readme_run
    assert (where / "store" / "manifest.json").is_file()
    store, answer = names["store"], names["answer"]
    assert store.tenants() == ["elena", "maya", "raj", "tomas-lena"]
    assert answer.results and answer.turns and answer.strategy == "auto" and answer.k == 5
    assert names["window"].turns and names["graph"].nodes


def test_search_answers_as_the_command_line_does(readme_run):
    where, names = readme_run
    store = names["store"]
    res = run_cli(["query", "--store", str(where / "store"), "--tenant", "maya", "Where did Maya move?",
                   "--strategy", "bm25", "--k", "5", "--json"])
    assert res.exit_code == 0, res.output
    cli = json.loads(res.output)
    ours = store.search("maya", "Where did Maya move?", strategy="bm25", k=5)
    assert [n.node_id for n in ours.results] == [n["node_id"] for n in cli["nodes"]]
    assert [t.turn_id for t in ours.turns] == [t["turn_id"] for t in cli["turns"]]
    assert ours.version == store.version == "v000001"


def test_search_takes_the_questions_time(readme_run):
    """A datetime or an ISO 8601 string: auto resolves the question's relative dates against it."""
    from datetime import datetime, timezone

    store = readme_run[1]["store"]
    index = store._service.index("maya")
    latest = max(t.time for t in index.turns.values() if t.time is not None)
    day = latest.astimezone(timezone.utc).date()
    asked = datetime(day.year, day.month, day.day, 12, tzinfo=timezone.utc)
    for when in (asked, asked.isoformat()):  # the latest session's day
        today = store.search("maya", "What did Maya say today?", strategy="auto", k=5, question_time=when)
        assert any(r.signals.get("time_window", 0) > 0 for r in today.results)
    anchored = store.search("maya", "What did Maya say today?", strategy="auto", k=5,
                            question_time=asked.replace(year=asked.year + 5))
    assert not any(r.signals.get("time_window", 0) > 0 for r in anchored.results)  # five years on: none


def test_a_bad_request_is_the_services_typed_error(readme_run):
    from memlib.serve.errors import ApiError, ErrorCode

    store = readme_run[1]["store"]
    for call, code in ((lambda: store.search("nobody", "q"), ErrorCode.UNKNOWN_TENANT),
                       (lambda: store.search("maya", "q", strategy="nope"), ErrorCode.UNKNOWN_STRATEGY),
                       (lambda: store.search("maya", "q", k=0), ErrorCode.BAD_K),
                       (lambda: store.search("maya", "q", question_time="next Monday"), ErrorCode.BAD_ARGUMENT),
                       (lambda: store.session("maya", "no-such-session"), ErrorCode.UNKNOWN_SESSION)):
        with pytest.raises(ApiError) as err:
            call()
        assert err.value.code is code, err.value.reason


def test_open_store_on_a_directory_without_a_store(tmp_path):
    import memlib
    from memlib.io.store import StoreError

    with pytest.raises(StoreError, match="not a memlib store"):
        memlib.open_store(tmp_path)


def test_memlib_build_says_where_the_build_is():
    import memlib

    with pytest.raises(AttributeError, match=r"jobs\.api\.build"):
        memlib.build  # noqa: B018 - the attribute access is the test


def test_import_memlib_loads_nothing_heavy():
    code = ("import sys, memlib; memlib.open_store; memlib.SAMPLE; "
            "print([m for m in ('pyarrow', 'lancedb', 'ray', 'polars', 'jobs') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert out.stdout.strip() == "[]"


def test_eval_of_a_jsonl_file_needs_no_format(readme_run):
    """``eval --input conversations.jsonl`` without --format assumed LoCoMo: "expected a JSON
    array at top level, found a JSON object"."""
    where, _ = readme_run
    res = run_cli(["eval", "--store", str(where / "store"), "--input", str(SAMPLE), "--strategies", "bm25",
                   "--out", str(where / "eval")])
    assert res.exit_code == 0, res.output
    assert (where / "eval" / "metrics.json").is_file()


def test_query_of_an_unknown_tenant_is_one_line(readme_run):
    where, _ = readme_run
    res = run_cli(["query", "--store", str(where / "store"), "--tenant", "nobody", "hello"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "nobody" in lines[0] and "Traceback" not in res.output


TRIP = [{"tenant_id": "elena", "conversation_id": "elena-trip", "session_id": "t1",
         "session_time": "2024-06-01T09:00:00+00:00", "turn_id": f"t1:{i}", "role": role, "speaker": who,
         "text": text}
        for i, (role, who, text) in enumerate([("user", "Elena", "I am booking the Kilimanjaro trek for August."),
                                               ("assistant", "Assistant", "Which route are you taking?"),
                                               ("user", "Elena", "The Lemosho route, eight days.")], 1)]


def test_forgetting_without_the_input(tmp_path):
    """``build --delete FILE --out STORE`` without --input: a tenant listed whole is dropped, a tenant
    with a forgotten conversation is rebuilt from its published turns, the others are carried."""
    from jobs.api import build
    from memlib.io.store import StoreReader

    lines = [ln for ln in SAMPLE.read_text(encoding="utf-8").splitlines()
             if '"tenant_id": "elena"' in ln or '"tenant_id": "raj"' in ln or '"tenant_id": "maya"' in ln]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines + [json.dumps(t) for t in TRIP]) + "\n", encoding="utf-8")
    store = tmp_path / "store"
    build(src, store)
    before = StoreReader(store)
    kept = [r for r in before.table("turns", "elena").to_pylist() if r["conversation_id"] == "elena-main"]
    assert kept and "Lemosho" in published_text(store)
    forget = tmp_path / "forget.txt"
    forget.write_text("raj\nelena/elena-trip\n", encoding="utf-8")
    res = run_cli(["build", "--delete", str(forget), "--out", str(store)])
    assert res.exit_code == 0, res.output
    after = StoreReader(store)
    assert after.version == "v000002" and after.tenants() == ["elena", "maya"]
    turns = after.table("turns", "elena").to_pylist()
    assert {r["conversation_id"] for r in turns} == {"elena-main"}
    assert sorted((r["session_id"], r["turn_id"], r["text"]) for r in turns) == \
        sorted((r["session_id"], r["turn_id"], r["text"]) for r in kept)
    assert after.table("questions", "elena").num_rows == before.table("questions", "elena").num_rows
    plan = after.manifest["incremental"]
    assert plan["built"] == ["elena"] and plan["carried"] == ["maya"] and plan["deleted"] == ["raj"]
    text = published_text(store)
    assert "Lemosho" not in text and "Kilimanjaro" not in text
    assert after.manifest["forgotten"] == {"tenants": ["raj"], "conversations": ["elena/elena-trip"]}
    # a line naming no published tenant forgets nothing, in one line
    other = tmp_path / "other.txt"
    other.write_text("nobody\n", encoding="utf-8")
    res = run_cli(["build", "--delete", str(other), "--out", str(store)])
    assert res.exit_code == 2 and "no tenant it names is in the published store" in res.output
    res = run_cli(["build", "--compact", "--out", str(store)])
    assert res.exit_code == 0 and res.output.startswith("compacted v000002: removed 1 older version(s) (v000001)")


def test_the_readmes_store_layout_is_a_real_stores(readme_run):
    """Every folder and file of a built version is named in the README's store block, and every name
    there exists, but those written only by LLM builds (``llm_calls/``)."""
    where, _ = readme_run
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## The store\n+```\n(.*?)```", text, re.S).group(1)
    version = block[block.index("STORE/versions/vNNNNNN/"):block.index("STORE/cache/")]
    named = set(re.findall(r"([a-z_]+(?:/|\.parquet))", version.replace("STORE/versions/vNNNNNN/", "")))
    real = {p.name + ("/" if p.is_dir() else "") for p in (where / "store" / "versions" / "v000001").iterdir()}
    assert real - named == set() and named - real == {"llm_calls/"}
    for top in ("manifest.json", "manifests/", "lance/", "versions/", "cache/"):
        assert f"STORE/{top}" in block and (where / "store" / top.rstrip("/")).exists()
    lance = {p.name for p in (where / "store" / "lance").iterdir()}
    assert lance == {"nodes.lance", "turn_text.lance"}


def test_demo_report_does_not_repeat_the_build_summary(readme_run):
    """`make demo` printed the store summary twice: once from `memlib build`, once from demo-report."""
    where, _ = readme_run
    res = run_cli(["demo-report", "--store", str(where / "store"), "--input", str(SAMPLE)])
    assert res.exit_code == 0, res.output
    assert "stage wall s" not in res.output and "sample question" in res.output

