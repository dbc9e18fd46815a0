"""The JSONL reader's outputs pinned on tricky input, to the byte.

The digests below were computed with the reader of main 6be7914 (every line decoded twice, each
check run on every record), before the reader learned its shortcuts (a tenant read off the line's
first key, checks skipped where a record cannot fail them, a turn kept as columns). Any change of a
table's bytes, a quarantine row, a fingerprint or an id of this input changes a digest.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest

from memlib import ids
from memlib.config import IOConfig
from memlib.io import generic, readers
from memlib.io.builder import TenantBuilder
from memlib.io.validate import parse_iso_time


def _turn(tenant: str, turn: str, text: object = "hello there", **kw) -> dict:
    rec = {"tenant_id": tenant, "conversation_id": "c1", "session_id": kw.pop("session", "s1"),
           "session_time": kw.pop("time", "2024-03-01T10:00:00Z"), "turn_id": turn, "speaker": "Ana",
           "role": "user", "text": text}
    rec.update(kw)
    return rec


def _j(obj, **kw) -> bytes:
    return json.dumps(obj, **kw).encode("utf-8")


def tricky_lines() -> list[bytes]:
    """Lines (without their newline) of every kind the reader treats specially."""
    deep = "[" * 150 + "]" * 150
    lines = [
        b"\xef\xbb\xbf" + _j(_turn("a", "t1", "first line behind a BOM")),
        _j(_turn("a", "t2", "caf\u00e9 \u2019 unicode kept", speaker="Zo\u00eb"), ensure_ascii=False),
        _j(_turn("a", "t3", "escaped unicode \u00e9")),  # \u00e9 written as an escape
        _j(_turn("b", "t1", "b's first run", time="2024-01-01")),
        _j(_turn("a", "t4", "a again: tenants interleaved in runs")),
        b'{"tenant_id": "a", "conversation_id": "c1", "session_id": "s2", "turn_id": "t5", "role": "user", '
        b'"text": "caf\xe9 is not UTF-8"}',
        _j(_turn("a", "t6", "nested too deep")).rstrip(b"}") + b', "extras": {"x": ' + deep.encode() + b"}}",
        _j(_turn("a", "t7", "nested 60 deep, kept", extras={"x": json.loads("[" * 60 + "]" * 60)})),
        _j(_turn("a", "t1", "duplicate of a's t1")),
        _j(_turn("a", "t8", "two tenant keys: the last wins", tenant_id="b")),
        b'{"tenant_id": "a", "conversation_id": "c1", "session_id": "s1", "turn_id": "t8b", "role": "user", '
        b'"text": "a duplicate tenant_id key: json keeps the last", "tenant_id": "b"}',
        _j({"tenant_id": "a", "conversation_id": "c1", "session_id": "s1", "turn_id": "t8c", "role": "user",
            "text": "only square brackets, 150 deep", "n": json.loads("[" * 150 + "]" * 150)}),
        _j({"tenant_id": "a", "session_id": "s1", "turn_id": "t8d", "role": "user", "text": "no conversation"}),
        _j(_turn("a", " ", "a blank turn id")),
        _j(_turn("a", "t8e", "a blank session id", session="\t")),
        _j(_turn("a", "t8f", "blanks after the record")) + b" \t ",
        _j(_turn("a", "t8g", "a value after the record")) + b" 1",
        _j(_turn("zz", "t9", "escaped duplicate key")).rstrip(b"}") + b', "tenant\\u005fid": "a"}',
        b'{"tenant_id": "\\u0061", "conversation_id": "c1", "session_id": "s1", "turn_id": "t10", '
        b'"role": "user", "text": "escaped tenant value"}',
        b'   {"tenant_id": "a", "conversation_id": "c1", "session_id": "s1", "turn_id": "t11", '
        b'"role": "assistant", "text": "leading blanks"}',
        b'{"conversation_id": "c1", "tenant_id": "a", "session_id": "s1", "turn_id": "t12", '
        b'"role": " User ", "text": "tenant not the first key"}',
        _j(_turn("a", "t13", "lone \ud800 surrogate")),
        _j(_turn("a", "t14", "surrogate in the speaker", speaker="x\udfff")),
        _j(_turn("a", "t15", "   ")),
        _j(_turn("a", "t16", 12)),
        _j(_turn("a", "t17", "x" * 300)),
        _j(_turn("a", "t18", "robot", role="robot")),
        _j(_turn("a", "t19", "no role", role=None)),
        _j(_turn("a", "t20", "bad date", time="the 31st of Smarch", session="s9")),
        _j(_turn("a", "t21", "offset date", time="2024-02-20T09:30:00+01:00", session="s0")),
        _j(_turn("a", "t22", "extras as a string", extras='{"k": [1, 2], "a": "\u00e9"}')),
        _j(_turn("a", "t23", "extras a list", extras=[1, 2])),
        _j(_turn("a", "t24", "extras a bad string", extras="{nope")),
        _j(_turn("a", "t25", "extras a deep string", extras="[" * 120 + "]" * 120)),
        _j(_turn("a", "t26", "NaN in extras", extras={"v": float("nan")})),
        _j({"kind": "question", "tenant_id": "a", "question_id": "q1", "question": "Who?", "answer": 3,
            "evidence": ["t1", {"x": 1}], "category": 2}),
        _j({"kind": "question", "tenant_id": "a", "question_id": "q2", "question": " "}),
        _j({"kind": "bogus", "tenant_id": "a", "turn_id": "t27"}),
        _j({"kind": "", "tenant_id": "a", "conversation_id": "c1", "session_id": "s1", "turn_id": "t28",
            "role": "USER", "text": "an empty kind is a turn"}),
        b"[1, 2]",
        b'"just a string"',
        b"",
        b"   ",
        b'{"tenant_id": "a", "turn_id": "t29", "n": ' + b"9" * 4400 + b"}",
        b'{"tenant_id": "a", "turn_id": "t30", "text": ',
        _j(_turn("a/b", "t31", "bad tenant")),
        _j(_turn("a", "t32", "a\x1fseparator\x00in text", turn_id="t\x1b32")),
        _j(_turn("b", "t2", "b's second run", conversation_id="c\x1f2")) + b"\r",
        _j(_turn("a", "t33", "word " * 2400)),  # longer than the test's record limit
        _j(_turn("a", "t34", "last line without a newline")),
    ]
    return lines


def _write(lines: list[bytes]):
    """The file in the working directory: its quarantine rows name it "tricky.jsonl" wherever it is."""
    path = Path("tricky.jsonl")
    path.write_bytes(b"\n".join(lines))
    return path


def _digest(results) -> str:
    h = hashlib.sha256()
    for r in results:
        for table in (r.turns, r.questions, r.quarantine):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
            h.update(sink.getvalue().to_pybytes())
    return h.hexdigest()


@pytest.fixture
def small_records(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(generic, "MAX_RECORD_BYTES", 8192)
    monkeypatch.setattr(generic, "_DRAIN", 1000)


CFG = IOConfig(max_turn_chars=200)
PINNED = {
    "index": "98c806c208b9ee8597ef24735b94f03fc17973c9a2291099a9c62bb24fd38ca9",
    "fingerprints": "82b6a36856e53397159c962ccafd679989de35ea72d385b5dbf837a0d16ee795",
    "tenants": "67492d779e821abd28fc95a6ebbd3d820b9013ae9dad3b50aeec55583291ff67",
    "batches": "3fc3d61839f171509e5cb0d45c274798af704f5eaf79bd3211bb549ae362bfc2",
    "batches_small": "67492d779e821abd28fc95a6ebbd3d820b9013ae9dad3b50aeec55583291ff67",
}


def _outputs(path) -> dict[str, str]:
    runs = {tenant: [(r.start, r.first_line, r.end, r.sha.hexdigest()) for r in tenant_runs]
            for tenant, tenant_runs in generic.index_runs(path).items()}
    fps = readers.input_fingerprints(path, "jsonl")
    small = list(generic.iter_batches(path, CFG, 300))
    return {
        "index": hashlib.sha256(json.dumps(runs).encode()).hexdigest(),
        "fingerprints": hashlib.sha256(json.dumps(fps, sort_keys=True).encode()).hexdigest(),
        "tenants": _digest(readers.iter_tenants(path, "jsonl", CFG)),
        "batches": _digest(readers.iter_batches(path, "jsonl", CFG)),
        "batches_small": _digest(small),
    }


def test_tricky_input_gives_the_pinned_tables(tmp_path, small_records):
    assert _outputs(_write(tricky_lines())) == PINNED


def test_tricky_input_read_without_its_index_cached_is_the_same(small_records, monkeypatch):
    monkeypatch.setattr(generic, "INDEX_CACHE_RUNS", 0)  # every read indexes the file anew
    assert _outputs(_write(tricky_lines())) == PINNED


ODD = ["plain", "", "a\x1fb", "\x1b", "nul\x00", "rs\x1e", "caf\u00e9", "lone \ud800", "x" * 3000, "\x1f\x1f"]


def test_column_ids_are_the_ids_of_each_row():
    triples = [(t, c, u) for t in ODD[:4] for c in ODD[2:6] for u in ODD]
    tenants, convs, turns = (list(col) for col in zip(*triples))
    assert ids.turn_node_ids(tenants, convs, turns) == [ids.turn_node_id(*t) for t in triples]
    assert ids.turn_node_ids(["t"], ["c"], [None]) == [ids.make_id("turn", "t", "c", None)]
    texts = [*ODD, None, 7]
    assert ids.content_hashes(texts) == [ids.content_hash(t) for t in texts]


@pytest.mark.parametrize("when", ["2024-03-01T10:00:00Z", "2024-03-01T10:00:00.123456+05:45", "1000-01-01",
                                  "8999-12-31T23:59:59.999999-01:00", "1969-12-31T23:59:59.5"])
def test_session_times_are_the_microseconds_arrow_stores(when):
    b = TenantBuilder("x", CFG, parse_iso_time, require_time=False)
    assert b.add_turn(_turn("a", "t1", time=when), "here", "raw")
    got = b.result().turns.column("session_time")
    assert got.cast(pa.int64()).to_pylist() == \
        pa.array([parse_iso_time(when)], got.type).cast(pa.int64()).to_pylist()
