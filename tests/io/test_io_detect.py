"""One --format rule for every command and the Python API: the format a caller names
wins; otherwise the content tells it, then the name; a file of no known format is one error
naming the formats looked for and what the file is; a reader's error under the wrong named
format says which one the file looks like."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memlib.io.detect import FORMATS, detect_format, explain, sniff
from memlib.io.errors import InputError
from memlib.io.readers import read_input

SAMPLE = Path(__file__).resolve().parents[2] / "memlib" / "data" / "sample_conversations.jsonl"


def test_content_tells_the_format_whatever_the_name(tmp_path):
    jsonl = tmp_path / "export.txt"
    jsonl.write_bytes(SAMPLE.read_bytes())
    locomo = tmp_path / "a.data"
    locomo.write_text(json.dumps([{"sample_id": "x", "conversation": {}}]), encoding="utf-8")
    lme = tmp_path / "b.json"
    lme.write_text(json.dumps([{"question_id": "q", "haystack_sessions": []}]), encoding="utf-8")
    table = read_input(SAMPLE, "jsonl").turns.select(["tenant_id", "conversation_id", "session_id", "turn_id",
                                                      "role", "text"])
    parquet = tmp_path / "turns.bin"
    pq.write_table(table, parquet)
    assert [detect_format(p) for p in (jsonl, locomo, lme, parquet)] == ["jsonl", "locomo", "longmemeval", "parquet"]


def test_the_shared_locomo_and_longmemeval_files(shared_data):
    assert detect_format(shared_data / "locomo_dev3.json") == "locomo"
    assert detect_format(shared_data / "longmemeval_s_dev24.json") == "longmemeval"
    assert detect_format(shared_data / "longmemeval_s_3haystacks_thirdparty_modified.json") == "longmemeval"


def test_a_named_format_wins_and_an_unknown_name_lists_the_known(tmp_path):
    assert detect_format(SAMPLE, "parquet") == "parquet"
    with pytest.raises(InputError, match="unknown format 'xml'; choose one of locomo, longmemeval, jsonl, parquet"):
        detect_format(SAMPLE, "xml")


@pytest.mark.parametrize("content,looks", [
    (b"just some notes\n", "neither JSON nor Parquet"),
    (json.dumps({"a": 1}, indent=2).encode(), "one JSON object spread over several lines"),
    (json.dumps([{"a": 1}]).encode(), "a JSON array whose first element holds neither 'conversation' nor"),
    (b"  \n", "an empty file"),
])
def test_an_undetectable_file_names_what_was_looked_for_and_what_it_is(tmp_path, content, looks):
    f = tmp_path / "in.dat"
    f.write_bytes(content)
    with pytest.raises(InputError) as err:
        detect_format(f)
    line = str(err.value)
    assert "\n" not in line and line.startswith(str(f))
    assert all(fmt in line for fmt in FORMATS) and looks in line


def test_a_known_suffix_decides_when_the_content_cannot(tmp_path):
    f = tmp_path / "day.jsonl"
    f.write_text("not json\n", encoding="utf-8")  # the JSONL reader quarantines the line, as before
    assert detect_format(f) == "jsonl"


def test_directories_and_uris(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "1.jsonl").write_bytes(SAMPLE.read_bytes())
    (tmp_path / "d" / "notes.txt").write_text("x")
    assert detect_format(tmp_path / "d") == "jsonl"
    assert detect_format("s3://bucket/day.parquet") == "parquet"
    with pytest.raises(InputError, match="cannot tell the format of an object storage URI"):
        detect_format("s3://bucket/day.json")
    with pytest.raises(InputError, match="file not found"):
        detect_format(tmp_path / "missing.jsonl")


def test_the_wrong_named_format_says_what_the_file_looks_like():
    with pytest.raises(InputError) as err:
        read_input(SAMPLE, "locomo")
    line = explain(err.value, SAMPLE, "locomo")
    assert "expected a JSON array at top level, found a JSON object" in line
    assert "the file looks like jsonl" in line and "pass --format jsonl" in line
    assert explain(err.value, SAMPLE, None) == str(err.value)  # detected formats need no hint
    assert sniff(SAMPLE)[0] == "jsonl"

