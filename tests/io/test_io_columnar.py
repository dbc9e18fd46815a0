"""The JSONL reader's columnar path (memlib/io/columnar.py) gives the record path's tables.

Each test reads a file twice: as the reader does (the columnar path answering where it can) and
with the columnar path turned off (every batch record by record), and compares the tables. The
inputs the columnar path must read are checked to have been read by it; those it must refuse are
checked to have been refused, and their tables to be the record path's all the same.
"""
from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest

from memlib.config import IOConfig
from memlib.io import columnar, generic, readers

CFG = IOConfig(max_turn_chars=500)


def _both(path, monkeypatch, batch_bytes: int = 1 << 20) -> tuple[list, list, list[bool]]:
    used: list[bool] = []
    real = columnar.read_columnar

    def spy(*args):
        out = real(*args)
        used.append(out is not None)
        return out

    monkeypatch.setattr(generic, "read_columnar", spy)
    fast = list(generic.iter_batches(path, CFG, batch_bytes))
    monkeypatch.setattr(generic, "read_columnar", lambda *args: None)
    slow = list(generic.iter_batches(path, CFG, batch_bytes))
    return fast, slow, used


def _same(fast, slow) -> None:
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        for name in ("turns", "questions", "quarantine"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.schema.equals(y.schema, check_metadata=True), name
            assert x.equals(y), name


def _records(shared_data) -> list[dict]:
    """LoCoMo's turns as JSONL records, sessions shuffled across the file, with odd but valid values."""
    turns = readers.read_input(shared_data / "locomo_dev3.json", "locomo", IOConfig()).turns.to_pylist()
    rng = random.Random(7)
    sessions: dict[tuple, list[dict]] = {}
    for t in turns:
        sessions.setdefault((t["tenant_id"], t["conversation_id"], t["session_id"]), []).append(t)
    order = list(sessions)
    rng.shuffle(order)
    out = []
    for n, key in enumerate(order):
        for i, t in enumerate(sessions[key]):
            when = t["session_time"]
            rec = {"tenant_id": t["tenant_id"], "conversation_id": t["conversation_id"], "session_id": t["session_id"],
                   "session_time": None if n % 7 == 3 or (n % 5 == 1 and i == 0) else when.isoformat(),
                   "turn_id": t["turn_id"], "speaker": t["speaker"] if n % 4 else None, "role": t["role"],
                   "text": t["text"][:CFG.max_turn_chars], "kind": "turn" if n % 3 else None}
            if n % 6 == 2:
                rec["text"] += " caf\u00e9 \U0001f600 a\x1fb\x00c\x1e"
                rec["note"] = {"nested": [[1, 2], {"x": None}], "n": float("inf")}
            if n % 11 == 5:
                rec["session_time"] = "1970-01-01T00:00:00Z"
            out.append(rec)
    return out


@pytest.mark.parametrize("ensure_ascii", [False, True])
def test_a_shuffled_real_input_is_read_by_columns_as_by_records(shared_data, tmp_path, monkeypatch, ensure_ascii):
    records = _records(shared_data)
    records.insert(40, {"kind": "question", "tenant_id": records[0]["tenant_id"], "question_id": "q1",
                        "question": "Who?", "answer": 3, "evidence": [records[0]["turn_id"], {"x": 1}]})
    records.insert(90, {"kind": "bogus", "tenant_id": records[0]["tenant_id"], "turn_id": "zz"})
    ends = [b"\n", b"\r\n"]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(json.dumps(r, ensure_ascii=ensure_ascii).encode() + ends[i % 7 == 0]
                              for i, r in enumerate(records)))
    fast, slow, used = _both(path, monkeypatch)
    assert used and all(used)
    _same(fast, slow)
    assert fast[0].questions.num_rows == 1 and fast[0].quarantine.num_rows == 1
    # small batches: several tenants' runs in one batch, and a tenant alone
    fast, slow, used = _both(path, monkeypatch, batch_bytes=20_000)
    assert len(used) > 1 and all(used)
    _same(fast, slow)


GOOD = {"tenant_id": "a", "conversation_id": "c1", "session_id": "s1", "session_time": "2024-03-01T10:00:00Z",
        "turn_id": "t0", "speaker": "Ana", "role": "user", "text": "hello there"}


def _j(**kw) -> bytes:
    return json.dumps({**GOOD, **kw}).encode()


REFUSED = {
    "role spelled otherwise": _j(role=" User "),
    "extras": _j(extras={"k": 1}),
    "extras as a string": _j(extras='{"k": 1}'),
    "a turn id twice": _j(turn_id="t1"),
    "blank text": _j(text=" \t "),
    "blank id": _j(session_id="\u2003"),
    "text too long": _j(text="x" * 501),
    "no text": json.dumps({k: v for k, v in GOOD.items() if k != "text"}).encode(),
    "a number for text": _j(text=5),
    "unparseable time": _j(session_time="the 31st of Smarch"),
    "bad tenant": _j(tenant_id="a/b"),
    "nested too deep": _j()[:-1] + b', "n": ' + b"[" * 150 + b"]" * 150 + b"}",
    "a long integer": _j()[:-1] + b', "n": ' + b"9" * 4400 + b"}",
    "invalid UTF-8 in a field not read": _j()[:-1] + b', "n": "caf\xe9"}',
    "a lone surrogate": _j(text="lone \ud800"),
    "a key twice": _j()[:-1] + b', "text": "again"}',
    "two objects on a line": _j() + _j(turn_id="t9"),
    "a blank line": b"   ",
    "not an object": b"[1, 2]",
    "a value after the record": _j() + b" 1",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_batch_the_record_path_treats_otherwise_is_read_by_records(tmp_path, monkeypatch, case):
    lines = [_j(turn_id=f"t{i}", session_id=f"s{i // 3}") for i in range(1, 8)]
    lines.insert(3, REFUSED[case])
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    fast, slow, used = _both(path, monkeypatch)
    assert used == [False]
    _same(fast, slow)


def test_a_bom_leaves_the_first_batch_to_the_records(tmp_path, monkeypatch):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(_j(turn_id=f"t{i}") for i in range(5)) + b"\n")
    fast, slow, used = _both(path, monkeypatch)
    assert used == [False]
    _same(fast, slow)


def test_turn_table_orders_sessions_as_the_builder_does():
    cols = {"tenant_id": ["b", "a", "a", "a", "a", "b"], "conversation_id": ["c", "c2", "c1", "c1", "c2", "c"],
            "session_id": ["s1", "s1", "s2", "s1", "s1", "s1"], "turn_id": ["1", "2", "3", "4", "5", "6"],
            "speaker": [None] * 6, "role": ["user"] * 6, "text": list("uvwxyz")}
    arrays = {k: pa.chunked_array([pa.array(v, pa.string())]) for k, v in cols.items()}
    times = [None, 5, 3, None, 1, 2]
    mask = np.array([t is None for t in times])
    table = columnar.turn_table({**arrays, "session_time": np.ma.array([t or 0 for t in times], mask=mask)})
    # a/c1: s2 (dated 3) before s1 (undated); a/c2/s1 takes its first dated time (5); b/c/s1 its first dated (2)
    assert table.column("turn_id").to_pylist() == ["3", "4", "2", "5", "1", "6"]
    assert table.column("session_index").to_pylist() == [1, 2, 1, 1, 1, 1]
    assert table.column("turn_index").to_pylist() == [0, 0, 0, 1, 0, 1]
    assert table.column("session_time").cast(pa.int64()).to_pylist() == [3, None, 5, 5, 2, 2]
