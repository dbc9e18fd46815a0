"""Common mistakes a newcomer makes with the command line: each ends in one line that
names what is wrong, exit 2, no traceback, and nothing made on disk. None of them starts Ray; the
mistakes that need a built store (an unknown tenant, eval of a JSONL file) are in
tests/core/test_api.py, which builds one."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.jobs.conftest import run_cli

SAMPLE = Path(__file__).resolve().parents[2] / "memlib" / "data" / "sample_conversations.jsonl"

# (id, command with {sample} {tmp} placeholders, fragment of the one error line, exit code)
MISTAKES = [
    ("text-file-no-format", "inspect --input {tmp}/notes.txt", "cannot tell the input format: looked for locomo", 2),
    ("stats-json-no-format", "build --input {tmp}/stats.json --out {tmp}/store",
     "the file is one JSON object spread over several lines", 2),
    ("wrong-format-named", "inspect --input {sample} --format locomo",
     "read as locomo; the file looks like jsonl", 2),
    ("unknown-format", "build --input {sample} --format xml --out {tmp}/store",
     "unknown format 'xml'; choose one of locomo", 2),
    ("missing-input", "build --input {tmp}/missing.jsonl --out {tmp}/store", "missing.jsonl: file not found", 2),
    ("no-input-no-delete", "build --out {tmp}/store", "--input is required to build", 2),
    ("delete-without-store", "build --delete {tmp}/forget.txt --out {tmp}/store",
     "not a memlib store (no manifest.json): --delete without --input", 2),
    ("unknown-strategy", "query --store {tmp}/store --tenant maya hello --strategy nope",
     "unknown retrieval strategy 'nope'; known strategies: assomem", 2),
    ("k-zero", "query --store {tmp}/store --tenant maya hello --k 0", "--k 0: at least 1 node", 2),
    ("query-no-store", "query --store {tmp}/store --tenant maya hello", "not a memlib store", 2),
    ("unknown-setting", "build --input {sample} --out {tmp}/store --set nope.key=1",
     "invalid configuration: nope: Extra inputs are not permitted", 2),
    ("unknown-recipe", "build --input {sample} --out {tmp}/store --recipe nope", "unknown recipe 'nope'", 2),
    ("empty-directory", "build --input {tmp}/empty --out {tmp}/store", "no input file", 2),
    ("mixed-directory", "inspect --input {tmp}/mixed", "files of 2 formats (jsonl, parquet)", 2),
    ("input-and-store", "inspect --input {sample} --store {tmp}/store", "pass exactly one of --input", 2),
    ("eval-no-store", "eval --store {tmp}/store --input {sample}", "not a memlib store", 2),
    ("zero-cpus", "build --input {sample} --out {tmp}/store --num-cpus 0", "--num-cpus 0: at least 1 CPU", 2),
    ("dry-run-forget", "build --delete {tmp}/forget.txt --out {tmp}/store --dry-run", "--dry-run needs --input", 2),
]


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("meeting notes, not conversations\n", encoding="utf-8")
    (tmp_path / "stats.json").write_text(json.dumps({"tenants": 10}, indent=2), encoding="utf-8")
    (tmp_path / "forget.txt").write_text("maya/maya-main\n", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.jsonl").write_bytes(SAMPLE.read_bytes())
    (tmp_path / "mixed" / "b.parquet").write_bytes(b"PAR1")
    return tmp_path


@pytest.mark.parametrize("command,fragment,code", [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_a_mistake_is_one_line_and_exit_2(workdir, command, fragment, code):
    args = command.format(sample=SAMPLE, tmp=workdir).split()
    res = run_cli(args)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert fragment in lines[0], lines[0]
    assert not (workdir / "store").exists()  # a mistake makes no store directory


def test_the_table_is_at_least_twelve_mistakes():
    assert len(MISTAKES) >= 12 and len({m[0] for m in MISTAKES}) == len(MISTAKES)


def test_a_reader_error_keeps_its_closing_quote(workdir):
    """``first element has no 'conversation'``: the message's own quote is kept (a blanket
    strip of quotes cut it)."""
    arr = workdir / "arr.json"
    arr.write_text(json.dumps([{"haystack_sessions": []}]), encoding="utf-8")
    res = run_cli(["inspect", "--input", str(arr), "--format", "locomo"])
    assert res.exit_code == 2
    assert "first element has no 'conversation'" in res.output
    assert "pass --format longmemeval" in res.output
