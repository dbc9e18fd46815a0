"""The bundled sample dataset and the ``memlib inspect`` command."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import memlib
from jobs.cli import app
from memlib.io.readers import read_input

SAMPLE = Path(memlib.__file__).parent / "data" / "sample_conversations.jsonl"
runner = CliRunner()


def _inspect(*args: str):
    return runner.invoke(app, ["inspect", *args])


def test_sample_dataset_parses():
    result = read_input(SAMPLE, "jsonl")
    s = result.summary()
    assert (s["tenants"], s["questions"]) == (4, 32)
    assert s["quarantined_by_reason"] == {"bad_date": 1, "bad_json": 1, "empty_text": 1, "unknown_role": 1}
    turns = result.turns.to_pylist()
    per_session = {}
    for t in turns:
        per_session.setdefault((t["tenant_id"], t["session_id"]), []).append(t)
    assert all(8 <= len(v) <= 16 for v in per_session.values())
    assert sum("image_caption" in (t["extras"] or "") for t in turns) >= 8
    ids = {(t["tenant_id"], t["turn_id"]) for t in turns}
    for q in result.questions.to_pylist():
        assert q["evidence"] and all((q["tenant_id"], e) in ids for e in q["evidence"]), q["question_id"]
        assert q["evidence_sessions"]


def test_inspect_locomo_table(locomo_path):
    res = _inspect("--input", str(locomo_path), "--format", "locomo")
    assert res.exit_code == 0, res.output
    lines = {ln.split()[0]: ln.split()[1] for ln in res.output.splitlines()[1:7] if ln.strip()}
    assert lines == {"tenants": "3", "conversations": "3", "sessions": "70", "turns": "1,451",
                     "questions": "497", "date": "range"}
    assert "2022-12-17T11:01:00+00:00" in res.output and "conv-41" in res.output


def test_inspect_json_counts_bad_file(bad_jsonl, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[io]\nmax_turn_chars = 200\n")
    res = _inspect("--input", str(bad_jsonl), "--json", "--config", str(cfg))
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["format"] == "jsonl"
    assert report["summary"]["turns"] == 5 and report["summary"]["quarantined"] == 10
    assert len(report["summary"]["quarantined_by_reason"]) == 10
    assert [t["tenant_id"] for t in report["tenants"]] == ["acme"]


@pytest.mark.parametrize("args, message", [
    (["--input", "/no/such/file.json", "--format", "locomo"], "file not found"),
    (["--input", "x.json"], "x.json: file not found"),  # missing, whatever its format
    ([], "exactly one of"),
])
def test_inspect_errors_exit_2(args, message):
    res = _inspect(*args)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output


def test_inspect_store_dispatch(monkeypatch, tmp_path):
    import sys
    import types
    calls = []
    fake = types.ModuleType("jobs.cli.inspect_store")
    fake.run = lambda store, echo=True: calls.append(store)
    fake.quarantine_summary = lambda store: {"records": 0, "by_reason": {}, "table": ""}
    monkeypatch.setitem(sys.modules, "jobs.cli.inspect_store", fake)
    monkeypatch.setattr("jobs.cli.inspect_store", fake, raising=False)
    res = _inspect("--store", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert calls == [tmp_path]


def test_inspect_a_directory_of_nightly_files(bad_jsonl, tmp_path):
    """A nightly input directory is inspected file by file, as the build reads it (the format's
    suffix; other files ignored); an unreadable file is named and the others still inspected."""
    night = tmp_path / "night"
    night.mkdir()
    (night / "2024-05-01.jsonl").write_bytes(SAMPLE.read_bytes())
    (night / "2024-05-02.jsonl").write_bytes(bad_jsonl.read_bytes())
    (night / "README.txt").write_text("not an input file")
    res = _inspect("--input", str(night), "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["format"] == "jsonl"
    assert [Path(f["input"]).name for f in report["files"]] == ["2024-05-01.jsonl", "2024-05-02.jsonl"]
    # each file's report is that file's own
    for f, src in zip(report["files"], (SAMPLE, bad_jsonl)):
        alone = json.loads(_inspect("--input", str(src), "--json").output)
        assert {**f, "input": None} == {**alone, "input": None}
    assert report["files"][0]["summary"]["tenants"] == 4
    text = _inspect("--input", str(night))
    assert text.exit_code == 0, text.output
    assert "2024-05-01.jsonl  (jsonl)" in text.output and "2024-05-02.jsonl  (jsonl)" in text.output
    # a file that cannot be read is named, the others are still inspected, exit 2
    (night / "2024-05-04.jsonl").write_bytes(b"not json at all\n")
    res = _inspect("--input", str(night))
    assert res.exit_code == 2 and "2024-05-01.jsonl  (jsonl)" in res.output
    assert "2024-05-04.jsonl: unreadable:" in res.output and "1 file(s) of" in res.output
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    res = _inspect("--input", str(empty), "--format", "locomo")
    assert res.exit_code == 2 and "no locomo input file in it" in res.output
    res = _inspect("--input", str(empty))
    assert res.exit_code == 2 and "a directory holding no input file; pass --format" in res.output
