"""Quarantine of bad records, unreadable files, tenant ids."""
from __future__ import annotations

import json

import pytest

from memlib.io.errors import InputError
from memlib.io.readers import read_input
from memlib.io.validate import validate_tenant_id
from tests.io.conftest import BAD_KINDS, GOOD


def test_ten_bad_kinds_give_ten_rows_and_keep_good(bad_jsonl, io_cfg):
    result = read_input(bad_jsonl, "jsonl", io_cfg)
    q = result.quarantine.to_pylist()
    assert sorted(r["reason_code"] for r in q) == sorted(BAD_KINDS)
    assert result.summary()["quarantined_by_reason"] == {k: 1 for k in BAD_KINDS}
    assert sorted(result.turns.column("turn_id").to_pylist()) == [t["turn_id"] for t in GOOD]
    kept_first = {r["turn_id"]: r["text"] for r in result.turns.to_pylist()}
    assert kept_first["t1"] == GOOD[0]["text"]  # the duplicate is the one quarantined
    by_code = {r["reason_code"]: r for r in q}
    assert by_code["bad_json"]["location"] == "line 3"
    assert by_code["bad_tenant_id"]["tenant_id"] is None
    assert by_code["bad_date"]["tenant_id"] == "acme" and "Smarch" in by_code["bad_date"]["reason"]
    assert all(r["source"] == str(bad_jsonl) and r["raw"] for r in q)
    assert len(by_code["oversize_turn"]["raw"]) <= 2048
    assert result.questions.to_pylist()[0]["evidence_sessions"] == ["s1"]


def test_sessions_ordered_by_time_and_utc(bad_jsonl, io_cfg):
    turns = read_input(bad_jsonl, "jsonl", io_cfg).turns.to_pylist()
    s2 = [t for t in turns if t["session_id"] == "s2"]
    assert s2[0]["session_index"] == 1  # s2 (20 Feb) is earlier than s1 (1 Mar)
    assert s2[0]["session_time"].isoformat() == "2024-02-20T08:30:00+00:00"
    assert [t["turn_index"] for t in s2] == [0, 1]


def test_session_order_rules(tmp_path, io_cfg):
    # sessions by their first dated turn's time (that time on all their turns), undated ones last in
    # record order, each conversation numbered on its own; turns in record order within a session;
    # rows sorted by tenant, conversation, session, turn whatever the record order
    def turn(conv, sess, tid, when=None):
        return {"tenant_id": "t", "conversation_id": conv, "session_id": sess, "turn_id": tid, "role": "user",
                "text": f"{conv} {tid}", **({"session_time": when} if when else {})}
    rows = [turn("c2", "late", "1", "2024-03-01"), turn("c1", "undated-a", "2"), turn("c1", "b", "3"),
            turn("c1", "b", "4", "2024-02-01T10:00:00+02:00"), turn("c1", "undated-z", "5"),
            turn("c1", "a", "6", "2024-02-01T09:00:00Z"), turn("c2", "early", "7", "2024-01-01"),
            turn("c1", "b", "8", "2023-01-01"), turn("c1", "undated-a", "9")]
    path = tmp_path / "o.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    got = [(t["conversation_id"], t["session_id"], t["session_index"], t["turn_index"], t["turn_id"],
            t["session_time"] and t["session_time"].isoformat())
           for t in read_input(path, "jsonl", io_cfg).turns.to_pylist()]
    b_time = "2024-02-01T08:00:00+00:00"
    assert got == [("c1", "b", 1, 0, "3", b_time), ("c1", "b", 1, 1, "4", b_time), ("c1", "b", 1, 2, "8", b_time),
                   ("c1", "a", 2, 0, "6", "2024-02-01T09:00:00+00:00"),
                   ("c1", "undated-a", 3, 0, "2", None), ("c1", "undated-a", 3, 1, "9", None),
                   ("c1", "undated-z", 4, 0, "5", None),
                   ("c2", "early", 1, 0, "7", "2024-01-01T00:00:00+00:00"),
                   ("c2", "late", 2, 0, "1", "2024-03-01T00:00:00+00:00")]


def test_bad_date_quarantines_only_its_row(tmp_path, io_cfg):
    rows = [{"tenant_id": "t", "conversation_id": "c", "session_id": "s", "turn_id": str(i), "role": "user",
             "text": f"turn {i}", "session_time": "2024-01-01" if i != 1 else "yesterday-ish"} for i in range(3)]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    result = read_input(path, "jsonl", io_cfg)
    assert result.turns.column("turn_id").to_pylist() == ["0", "2"]
    assert result.quarantine.column("reason_code").to_pylist() == ["bad_date"]


def test_locomo_bad_records(tmp_path, io_cfg):
    sample = {"sample_id": "s1", "qa": [{"question": "q?", "answer": "a", "evidence": ["D1:1"], "category": 1}],
              "conversation": {"speaker_a": "A", "speaker_b": "B",
                               "session_1_date_time": "1:56 pm on 8 May, 2023",
                               "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hello there"},
                                             {"speaker": "B", "dia_id": "D1:2", "text": ""}],
                               "session_2_date_time": "someday", "session_2": [
                                   {"speaker": "A", "dia_id": "D2:1", "text": "x"}],
                               "session_3": "oops"}}
    path = tmp_path / "l.json"
    path.write_text(json.dumps([sample, {"no": "sample"}]))
    result = read_input(path, "locomo", io_cfg)
    assert result.turns.column("turn_id").to_pylist() == ["D1:1"]
    codes = result.quarantine.column("reason_code").to_pylist()
    assert codes == ["empty_text", "bad_date", "bad_session", "missing_field"]
    assert result.quarantine.column("location").to_pylist()[0] == "s1.session_1[1]"


@pytest.mark.parametrize("content, fmt, message", [
    (None, "locomo", "file not found"),
    (b'{"a": 1}', "locomo", "expected a JSON array"),
    (b"", "longmemeval", "file is empty"),
    (b'[{"sample_id": "x", "conversation": {}}', "locomo", "malformed JSON"),
    (b'[{"question_id": "x"}]', "locomo", "not a LoCoMo file"),
    (b'[{"sample_id": "x"}]', "longmemeval", "not a LongMemEval file"),
    (b"hello\nworld\n", "jsonl", "not a JSONL file"),
    (b"PAR1 not really", "parquet", "not a Parquet file"),
    (b"[]", "csv", "unknown input format"),
])
def test_unreadable_file_is_input_error(tmp_path, content, fmt, message):
    path = tmp_path / "input.bin"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError, match=message) as info:
        read_input(path, fmt)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("value, ok", [("conv-26", True), ("a.b_c-1", True), ("x" * 128, True),
                                       ("x" * 129, False), ("../etc", False), ("a/b", False),
                                       (".hidden", False), ("", False), (5, False), ("a b", False)])
def test_validate_tenant_id(value, ok):
    assert (validate_tenant_id(value) is None) is ok


def test_structural_reason_codes(tmp_path):
    base = {"tenant_id": "t", "conversation_id": "c", "session_id": "s", "turn_id": "1", "role": "user", "text": "ok"}
    lines = [json.dumps(base), "[1, 2]", json.dumps({**base, "turn_id": "2", "extras": [1]}),
             json.dumps({"kind": "question", "tenant_id": "t", "question_id": "q"}),
             json.dumps({**base, "turn_id": "3", "kind": "memo"}),
             json.dumps({"kind": "question", "tenant_id": "t", "question_id": "q2", "question": "ok?",
                         "evidence": ["1"], "question_time": "2024-05-01"})]
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = read_input(path, "jsonl")
    assert result.quarantine.column("reason_code").to_pylist() == \
        ["not_object", "bad_extras", "bad_question", "unknown_kind"]
    assert result.turns.num_rows == 1
    q = result.questions.to_pylist()[0]
    assert q["evidence_sessions"] == ["s"] and q["question_time"].isoformat() == "2024-05-01T00:00:00+00:00"
