"""Readers under hostile input: unusable files are one-line errors,
a file that shrinks while it is read ends the read, one bad record never crashes a read, a bad
session date costs only its own row, ids are unambiguous and tenant ids validated exactly."""
from __future__ import annotations

import json
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memlib import ids
from memlib.io import generic
from memlib.io.errors import InputError
from memlib.io.readers import input_fingerprints, read_input
from memlib.io.validate import validate_tenant_id


def _turn(tid: str, text: str = "hello there", **kw) -> dict:
    rec = {"tenant_id": "maya", "conversation_id": "c", "session_id": "s1", "session_time": "2024-05-01T10:00:00Z",
           "turn_id": tid, "speaker": "Maya", "role": "user", "text": text}
    rec.update(kw)
    return rec


def _jsonl(path, records) -> bytes:
    data = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()
    path.write_bytes(data)
    return data


# -- item 1: unusable files ------------------------------------------------------------------

@pytest.mark.parametrize("content, message", [
    (b"", "empty"),
    (b"\n  \n\t\n", "empty"),
    (json.dumps(_turn("s1:1")) + "\n", "UTF-16"),
    (b"\xff\xfe\x00\x00{\x00\x00\x00", "UTF-32"),
    (b"\x00\x00\x00\x00binary", "NUL"),
])
def test_unusable_jsonl_is_an_input_error(tmp_path, content, message):
    path = tmp_path / "in.jsonl"
    if isinstance(content, str):  # UTF-16 with its byte order mark
        content = content.encode("utf-16")
    path.write_bytes(content)
    for call in (lambda: read_input(path, "jsonl"), lambda: input_fingerprints(path, "jsonl")):
        with pytest.raises(InputError) as exc:
            call()
        assert message in str(exc.value) and "\n" not in str(exc.value)


def test_jsonl_without_any_tenant_is_an_input_error(tmp_path):
    path = tmp_path / "in.jsonl"
    _jsonl(path, [{"user": "maya", "text": "hi"}, {"user": "raj", "text": "yo"}])
    with pytest.raises(InputError, match="tenant_id"):
        input_fingerprints(path, "jsonl")


@pytest.mark.parametrize("fmt, content", [("locomo", b""), ("longmemeval", b"  \n"),
                                          ("locomo", "[]".encode("utf-16"))])
def test_unusable_json_is_an_input_error(tmp_path, fmt, content):
    path = tmp_path / "in.json"
    path.write_bytes(content)
    with pytest.raises(InputError):
        input_fingerprints(path, fmt)


def test_empty_parquet_is_an_input_error(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"tenant_id": pa.array([], pa.string()), "text": pa.array([], pa.string())}), path)
    with pytest.raises(InputError, match="no rows"):
        input_fingerprints(path, "parquet")


# -- item 2: a file that shrinks while it is read --------------------------------------------

def test_file_truncated_between_index_and_read_ends_with_an_error(tmp_path, monkeypatch):
    path = tmp_path / "in.jsonl"
    _jsonl(path, [_turn(f"s1:{i}", "x" * 200) for i in range(50)])
    real_index = generic.index_runs

    def index_then_truncate(p):
        runs = real_index(p)
        with open(p, "r+b") as fh:
            fh.truncate(1000)
        return runs

    monkeypatch.setattr(generic, "index_runs", index_then_truncate)
    outcome: list = []

    def read() -> None:
        try:
            read_input(path, "jsonl")
            outcome.append("returned")
        except InputError as exc:
            outcome.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(30)
    assert outcome, "the read hung on the truncated file"
    assert isinstance(outcome[0], InputError) and "changed while" in str(outcome[0])


def test_file_rewritten_between_index_and_read_is_detected(tmp_path, monkeypatch):
    path = tmp_path / "in.jsonl"
    _jsonl(path, [_turn(f"s1:{i}", "original text") for i in range(5)])
    real_index = generic.index_runs

    def index_then_rewrite(p):
        runs = real_index(p)
        _jsonl(p, [_turn(f"s1:{i}", "replaced text") for i in range(5)])  # same length, other bytes
        return runs

    monkeypatch.setattr(generic, "index_runs", index_then_rewrite)
    with pytest.raises(InputError, match="changed while"):
        read_input(path, "jsonl")


# -- item 3: one bad record never crashes a read ---------------------------------------------

def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_deeply_nested_record_is_quarantined(tmp_path, depth):
    path = tmp_path / "in.jsonl"
    deep = json.dumps(_turn("s1:2"))[:-1] + ', "extras": {"x": ' + _deep(depth) + "}}"
    _jsonl(path, [_turn("s1:1"), deep, _turn("s1:3")])
    result = read_input(path, "jsonl")
    assert result.turns.column("turn_id").to_pylist() == ["s1:1", "s1:3"]
    q = result.quarantine.to_pylist()
    assert [r["reason_code"] for r in q] == ["too_deep"] and q[0]["location"] == "line 2"
    assert q[0]["tenant_id"] == "maya"
    assert set(input_fingerprints(path, "jsonl")) == {"maya"}


@pytest.mark.parametrize("field", ["text", "turn_id", "speaker", "session_id", "extras"])
def test_lone_surrogate_is_quarantined(tmp_path, field):
    path = tmp_path / "in.jsonl"
    bad = _turn("s1:2")
    bad[field] = {"note": "a\ud800b"} if field == "extras" else "a\ud800b"
    _jsonl(path, [_turn("s1:1"), bad, _turn("s1:3")])  # json.dumps writes the surrogate as \ud800
    result = read_input(path, "jsonl")
    assert result.turns.column("turn_id").to_pylist() == ["s1:1", "s1:3"]
    q = result.quarantine.to_pylist()
    assert [r["reason_code"] for r in q] == ["bad_unicode"] and field in q[0]["reason"]
    pq.write_table(result.quarantine, tmp_path / "q.parquet")  # the quarantine row itself is writable


def test_lone_surrogate_in_a_question_is_quarantined(tmp_path):
    path = tmp_path / "in.jsonl"
    _jsonl(path, [_turn("s1:1"), {"kind": "question", "tenant_id": "maya", "question_id": "q\udfff",
                                   "question": "what?"}])
    result = read_input(path, "jsonl")
    assert result.questions.num_rows == 0 and result.quarantine.column("reason_code").to_pylist() == ["bad_unicode"]


# -- item 5: a bad session date costs only its own row ---------------------------------------

def test_bad_session_date_quarantines_only_its_row(tmp_path):
    path = tmp_path / "in.jsonl"
    rows = [_turn(f"s1:{i}", f"turn number {i}") for i in range(1, 6)]
    rows.append(_turn("s1:6", "the odd one", session_time="the day after never"))
    rows.append(_turn("s1:6", "a valid row reusing the dropped row's id"))
    _jsonl(path, rows)
    result = read_input(path, "jsonl")
    turns = result.turns.to_pylist()
    assert [t["turn_id"] for t in turns] == ["s1:1", "s1:2", "s1:3", "s1:4", "s1:5", "s1:6"]
    assert turns[-1]["text"] == "a valid row reusing the dropped row's id"
    assert {t["session_time"].isoformat() for t in turns} == {"2024-05-01T10:00:00+00:00"}
    q = result.quarantine.to_pylist()
    assert [(r["reason_code"], r["location"]) for r in q] == [("bad_date", "line 6")]


# -- item 6: BOM, unambiguous ids, exact tenant validation ----------------------------------

def test_utf8_bom_keeps_the_first_record(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(_turn(f"s1:{i}")) + "\n" for i in range(3)).encode())
    result = read_input(path, "jsonl")
    assert result.turns.num_rows == 3 and result.quarantine.num_rows == 0
    assert set(input_fingerprints(path, "jsonl")) == {"maya"}


def test_utf8_bom_json_array_is_read(tmp_path, locomo_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + locomo_path.read_bytes())
    assert read_input(path, "locomo").turns.num_rows == read_input(locomo_path, "locomo").turns.num_rows


def test_ids_with_the_separator_do_not_collide():
    assert ids.turn_node_id("t", "c\x1fx", "s1:1") != ids.turn_node_id("t", "c", "x\x1fs1:1")
    assert ids.digest(None) != ids.digest("\x00")
    assert ids.digest("a\x1b", "b") != ids.digest("a", "\x1bb")
    # ids of ordinary parts are unchanged by the escaping (stores stay valid)
    assert ids.turn_node_id("maya", "c", "s1:1") == "turn:" + _plain_digest("turn", "maya", "c", "s1:1")


def test_joined_escaped_parts_are_the_parts_escaped_one_by_one():
    # join_escaped (the session keys' row hash) skips the per-part escaping only when the joined
    # bytes hold no byte to escape but the separators it put there
    import random

    rng = random.Random(38)
    alphabet = [b"a", b"b", b"\x00", b"\x1b", b"\x1e", b"\x1f", "\u00e9".encode()]
    for _ in range(3000):
        parts = [b"".join(rng.choices(alphabet, k=rng.randrange(4))) for _ in range(rng.randrange(1, 5))]
        assert ids.join_escaped(parts) == b"\x1f".join(ids.escape(p) for p in parts), parts
    assert ids.join_escaped([b"a\x1fb", b"c"]) != ids.join_escaped([b"a", b"b\x1fc"])
    assert ids.escape(b"plain") == b"plain" and ids.escape(b"a\x1eb") == b"a\x1b\x1eb"


def test_digest_is_the_escaped_parts_hashed_one_after_another():
    # digest hashes parts without None joined at once: the same bytes as part by part
    import hashlib
    import random

    def by_parts(*parts: object) -> str:
        h = hashlib.blake2b(digest_size=16)
        for i, p in enumerate(parts):
            raw = b"\x00" if p is None else ids.escape(str(p).encode("utf-8", "surrogatepass"))
            h.update((b"\x1f" if i else b"") + raw)
        return h.hexdigest()[:ids.HEX_LEN]

    rng = random.Random(49)
    alphabet = ["a", "\x00", "\x1b", "\x1e", "\x1f", "\u00e9", "\ud800"]
    for _ in range(3000):
        parts = [rng.choice([None, 7, "".join(rng.choices(alphabet, k=rng.randrange(3)))])
                 for _ in range(rng.randrange(5))]
        assert ids.digest(*parts) == by_parts(*parts), parts
    assert ids.digest("a\x1f", "b") != ids.digest("a", "\x1fb") and ids.digest("a", None) != ids.digest("a", "\x00")


def test_session_keys_tell_a_separator_inside_a_value_from_one_between_values():
    from memlib.compose.sessions import session_keys

    def keys(speaker: str, role: str) -> str:
        turns = pa.table({"tenant_id": ["t"], "conversation_id": ["c"], "session_id": ["s"], "session_index": [1],
                          "session_time": [None], "turn_id": ["1"], "turn_index": [0], "node_id": ["n"],
                          "speaker": [speaker], "role": [role], "text": ["hi"], "extras": [None]})
        return session_keys(turns, "key").to_pylist()[0]

    assert keys("a\x1fb", "c") != keys("a", "b\x1fc")
    assert keys("a", "b") != keys("a\x00", "b")


@pytest.mark.parametrize("texts", [["hello", "hi \xe9", "x\ny", "z"], ["hello", "a\x1fb", "x", "y\x1e"],
                                   ["hello", "hi", "\x1b", "z"], ["hello", "hi", "x\x00", "z"]])
def test_session_keys_of_rows_in_session_order_equal_those_hashed_value_by_value(texts):
    # rows already in session order (a build's staged files: not sorted again), in two chunks, one
    # of them a slice, a long text column: the keys are those of every value joined by ids.join_escaped
    import hashlib

    from memlib.compose.sessions import session_keys

    def table(rows: list[int], text_type: pa.DataType) -> pa.Table:
        return pa.table({"tenant_id": ["t"] * len(rows), "conversation_id": ["c"] * len(rows),
                         "session_id": [f"s{r // 2}" for r in rows], "session_index": [r // 2 for r in rows],
                         "session_time": pa.array([None] * len(rows), pa.timestamp("us", tz="UTC")),
                         "turn_id": [str(r) for r in rows], "turn_index": [r % 2 for r in rows],
                         "node_id": [f"n{r}" for r in rows], "speaker": ["A"] * len(rows), "role": ["user"] * len(rows),
                         "text": pa.array([texts[r % len(texts)] for r in rows], text_type),
                         "extras": [None] * len(rows)})

    for text_type in (pa.string(), pa.large_string()):
        turns = pa.concat_tables([table([0, 1], text_type), table([9, 2, 3], text_type).slice(1)])
        blobs: dict[str, bytes] = {}
        for row in turns.to_pylist():
            values = [("" if v is None else str(v)).encode("utf-8") for v in row.values()]
            blobs[row["session_id"]] = blobs.get(row["session_id"], b"") + b"\x1e" + ids.join_escaped(values)
        expected = {s: hashlib.sha256(b"bk" + b).hexdigest()[:32] for s, b in blobs.items()}
        assert session_keys(turns, "bk").to_pylist() == [expected[s] for s in turns.column("session_id").to_pylist()]


@pytest.mark.parametrize("texts, expected", [
    (["hello", "hi \xe9", "x", "y"], ["ca0ff9d503f12502343573831f6cb9a7", "e3f46809cb1d670d368d3131473bf9a0",
                                       "6d6584e36c617aabd67838284091127e"]),
    (["a\x1fb", "hi", "x\x00\x1b", "y\x1e"], ["ef6e984feab67b000a79ba1fad21a6fd", "d5bb86fd053f6fcd67f5c9c346e9bdff",
                                             "76499445e899a0414f6b129a028f73bb"]),
])
def test_session_keys_are_pinned(texts, expected):
    # the keys kept sessions are stored under: rows joined by Arrow when no value needs escaping, value
    # by value otherwise; out-of-order rows, a null speaker and time, a time with microseconds
    from datetime import datetime, timezone

    from memlib import schema
    from memlib.compose.sessions import session_keys

    times = [datetime(2024, 5, 1, 9, 30, tzinfo=timezone.utc)] * 2 + [None, datetime(2024, 5, 2, 1, 2, 3, 456,
                                                                                       tzinfo=timezone.utc)]
    turns = schema.conform(pa.table({
        "tenant_id": ["t"] * 4, "conversation_id": ["c", "c", "d", "c"], "session_id": ["s", "s", "s", "u"],
        "session_index": [1, 1, 1, 2], "session_time": pa.array(times, schema.TS), "turn_id": ["2", "1", "1", "9"],
        "turn_index": [1, 0, 0, 0], "node_id": ["n2", "n1", "n3", "n4"], "speaker": ["A", None, "B", "A"],
        "role": ["user"] * 4, "text": texts, "content_hash": ["h"] * 4, "extras": [None, '{"k": 1}', None, None]}),
        schema.TURNS)
    assert session_keys(turns, "bk").to_pylist() == [expected[0], *expected]


def _plain_digest(*parts: str) -> str:
    import hashlib

    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).hexdigest()[:ids.HEX_LEN]


def test_colliding_ids_of_the_issue_keep_both_turns(tmp_path):
    path = tmp_path / "in.jsonl"
    _jsonl(path, [_turn("s1:1", "first", conversation_id="c\x1fx"), _turn("x\x1fs1:1", "second", conversation_id="c")])
    turns = read_input(path, "jsonl").turns
    assert turns.num_rows == 2 and len(set(turns.column("node_id").to_pylist())) == 2


@pytest.mark.parametrize("value", ["maya\n", "maya\r\n", "\nmaya", "ma\nya"])
def test_tenant_id_with_newline_is_invalid(value):
    assert validate_tenant_id(value) is not None


# -- the next ones of the same families ---------------------------------------------------------

def test_number_too_long_to_convert_is_quarantined(tmp_path):
    path = tmp_path / "in.jsonl"
    huge = json.dumps(_turn("s1:2"))[:-1] + ', "n": ' + "9" * 5000 + "}"
    _jsonl(path, [_turn("s1:1"), huge])
    result = read_input(path, "jsonl")
    assert result.turns.column("turn_id").to_pylist() == ["s1:1"]
    q = result.quarantine.to_pylist()
    assert [(r["reason_code"], r["tenant_id"]) for r in q] == [("bad_json", "maya")]


def _locomo(samples) -> str:
    return json.dumps(samples)


def _sample(sid, **sessions) -> dict:
    conv = {"speaker_a": "A", "speaker_b": "B"}
    for key, turns in sessions.items():
        conv[key] = turns
        conv[f"{key}_date_time"] = "1:56 pm on 8 May, 2023"
    return {"sample_id": sid, "conversation": conv, "qa": []}


def test_locomo_odd_records_never_crash(tmp_path):
    deep = "[" * 20_000 + "]" * 20_000
    good = _sample("a", session_1=[{"speaker": "A", "dia_id": "D1:1", "text": "hello"},
                                   {"speaker": "A", "dia_id": "D1:2", "text": "deep", "img_url": "IMG"}])
    text = _locomo([good, {"sample_id": ["not", "a", "string"], "conversation": {}}])
    path = tmp_path / "in.json"
    path.write_text(text.replace('"IMG"', deep), encoding="utf-8")
    fps = input_fingerprints(path, "locomo")
    assert "a" in fps and len(fps) == 2
    result = read_input(path, "locomo")
    assert result.turns.column("turn_id").to_pylist() == ["D1:1"]
    assert sorted(r["reason_code"] for r in result.quarantine.to_pylist()) == ["missing_field", "too_deep"]
    # editing the deep record changes its tenant's fingerprint
    path.write_text(text.replace('"IMG"', deep.replace("[]", "[1]")), encoding="utf-8")
    assert input_fingerprints(path, "locomo")["a"] != fps["a"]


def test_locomo_session_key_is_matched_exactly(tmp_path):
    sample = _sample("a", session_1=[{"speaker": "A", "dia_id": "D1:1", "text": "hello"}])
    sample["conversation"]["session_1\n"] = [{"speaker": "A", "dia_id": "D1:1", "text": "a second session 1"}]
    path = tmp_path / "in.json"
    path.write_text(_locomo([sample]), encoding="utf-8")
    result = read_input(path, "locomo")
    assert result.turns.column("text").to_pylist() == ["hello"] and result.quarantine.num_rows == 0


def test_corrupt_parquet_pages_are_an_input_error(tmp_path):
    path = tmp_path / "in.parquet"
    rows = [_turn(f"s1:{i}", "some words " * 50) for i in range(200)]
    pq.write_table(pa.Table.from_pylist(rows), path, compression="zstd")
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    data[4:len(data) - footer] = b"\xa5" * (len(data) - footer - 4)
    path.write_bytes(bytes(data))
    for call in (lambda: read_input(path, "parquet"), lambda: input_fingerprints(path, "parquet")):
        with pytest.raises(InputError, match="unreadable Parquet data"):
            call()


def test_duplicate_locomo_sample_is_one_tenant_in_the_build(tmp_path):
    """Two samples with one sample_id: the reader yields both; the shard step merges them (the
    second's repeated dia_ids quarantined) instead of the second overwriting the first."""
    from memlib.config import MemlibConfig
    from memlib.io.store import StoreWriter
    from pipelines.shard import shard_input, staged_rows

    a = _sample("a", session_1=[{"speaker": "A", "dia_id": "D1:1", "text": "first copy"}])
    b = _sample("a", session_1=[{"speaker": "A", "dia_id": "D1:1", "text": "repeated id"},
                                {"speaker": "B", "dia_id": "D1:2", "text": "only in the second"}])
    path = tmp_path / "in.json"
    path.write_text(_locomo([a, b]), encoding="utf-8")
    writer = StoreWriter(tmp_path / "store", dim=8)
    res = shard_input(path, "locomo", MemlibConfig(), writer, merged={})
    turns = staged_rows(res.shards[-1].turns_path, "a").to_pylist()
    assert [t["text"] for t in turns] == ["first copy", "only in the second"] and len(res.shards) == 2
    assert res.quarantine_by_reason == {"duplicate_turn_id": 1}


def test_line_longer_than_the_record_limit_is_quarantined_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(generic, "MAX_RECORD_BYTES", 4096)
    monkeypatch.setattr(generic, "_DRAIN", 1000)
    path = tmp_path / "in.jsonl"
    long = json.dumps(_turn("s1:2", "word " * 5000))
    _jsonl(path, [_turn("s1:1"), long, _turn("s1:3")])
    fps = input_fingerprints(path, "jsonl")
    result = read_input(path, "jsonl")
    assert result.turns.column("turn_id").to_pylist() == ["s1:1", "s1:3"]
    q = result.quarantine.to_pylist()
    assert [(r["reason_code"], r["tenant_id"], r["location"]) for r in q] == [("oversize_record", "maya", "line 2")]
    _jsonl(path, [_turn("s1:1"), long.replace("word", "wore"), _turn("s1:3")])  # same size, other bytes
    assert input_fingerprints(path, "jsonl") != fps


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "0500-01-01"])
def test_dates_beyond_datetime_range_are_bad_dates(tmp_path, when):
    """Converting these to UTC overflowed datetime (OverflowError: a crash of the whole read)."""
    path = tmp_path / "in.jsonl"
    _jsonl(path, [_turn("s1:1"), _turn("s1:2", session_time=when),
                  {"kind": "question", "tenant_id": "maya", "question_id": "q1", "question": "when?",
                   "question_time": when}])
    result = read_input(path, "jsonl")
    assert result.turns.column("turn_id").to_pylist() == ["s1:1"]
    assert result.quarantine.column("reason_code").to_pylist() == ["bad_date", "bad_date"]


def test_a_turn_without_a_role_is_a_missing_field(tmp_path):
    """A record with no role (or an empty one) is quarantined as missing_field, naming the field;
    a role that is not one of the three stays unknown_role."""
    from memlib.config import IOConfig
    from memlib.io.readers import read_input

    recs = [{"tenant_id": "acme", "conversation_id": "c1", "session_id": "s1", "turn_id": f"t{i}",
             "text": "hello there", **extra}
            for i, extra in enumerate([{"role": "user"}, {}, {"role": " "}, {"role": "robot"}])]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    q = read_input(path, "jsonl", IOConfig()).quarantine.to_pylist()
    assert [(r["record_id"], r["reason_code"]) for r in q] == [("t1", "missing_field"), ("t2", "missing_field"),
                                                               ("t3", "unknown_role")]
    assert "missing field: role" in q[0]["reason"]


# -- a field every record lacks is named before any work, with the file's name for it --

@pytest.mark.parametrize("rename, message", [
    (("text", "content"), "every record lacks `text`; the file has `content`, perhaps it is that: map it to `text`"),
    (("tenant_id", "user_id"), "every record lacks `tenant_id`; the file has `user_id`"),
    (("turn_id", "message_id"), "every record lacks `turn_id`; the file has `message_id`"),
    (("role", "rol"), "every record lacks `role`; the file has `rol`"),
])
def test_a_field_every_record_lacks_is_named_with_its_likely_name(tmp_path, rename, message):
    """Before: `content` instead of `text` read as 3 quarantined records (the build published 0 tenants)."""
    old, new = rename
    recs = [{(new if k == old else k): v for k, v in _turn(f"s1:{i}").items()} for i in range(3)]
    path = tmp_path / "in.jsonl"
    _jsonl(path, recs)
    for call in (lambda: read_input(path, "jsonl"), lambda: input_fingerprints(path, "jsonl")):
        with pytest.raises(InputError) as exc:
            call()
        assert message in str(exc.value) and "\n" not in str(exc.value), exc.value
    table = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(recs), table)
    with pytest.raises(InputError, match=f"no column `{old}`; the file has `{new}`"):
        input_fingerprints(table, "parquet")


def test_a_field_no_record_fills_counts_the_records_holding_its_key(tmp_path):
    # records of three key layouts (the tally counts each layout once per record)
    recs = [_turn("s1:1", text=""), {**_turn("s1:2"), "text": "  ", "extra": 1},
            {"content": "hi", **{k: v for k, v in _turn("s1:3").items() if k != "text"}}, _turn("s1:4", text="")]
    path = tmp_path / "in.jsonl"
    _jsonl(path, recs)
    with pytest.raises(InputError, match=r"no record has a non-empty string `text` \(3 of 4 have the key\); "
                                         r"the file has `content`"):
        input_fingerprints(path, "jsonl")


def test_roles_memlib_does_not_know_are_named(tmp_path):
    path = tmp_path / "in.jsonl"
    _jsonl(path, [_turn("s1:1", role="human"), _turn("s1:2", role="ai"), {"kind": "question", "tenant_id": "maya",
                                                                          "question_id": "q", "question": "why?"}])
    with pytest.raises(InputError, match="no record has a role memlib knows .*'human', 'ai'"):
        input_fingerprints(path, "jsonl")


def test_a_field_some_records_lack_is_quarantined_as_before(tmp_path):
    path = tmp_path / "in.jsonl"
    bad = {k: v for k, v in _turn("s1:2").items() if k != "text"} | {"content": "hi"}
    _jsonl(path, [_turn("s1:1"), bad, {"kind": "question", "tenant_id": "maya", "question_id": "q", "question": "?"}])
    res = read_input(path, "jsonl")
    assert res.turns.num_rows == 1 and res.quarantine.column("reason_code").to_pylist() == ["missing_field"]
    questions = tmp_path / "q.parquet"  # questions alone need no turn columns
    pq.write_table(pa.Table.from_pylist([{"kind": "question", "tenant_id": "maya", "question_id": "q",
                                          "question": "where?"}]), questions)
    assert read_input(questions, "parquet").questions.num_rows == 1
