"""Property-based fuzzing of the readers: JSONL, Parquet and LoCoMo JSON files mixing
valid records with malformed ones of every kind. For every generated file: the reader never
crashes (a file-level InputError only when nothing in it is valid), every valid record is kept
exactly, and every rejected record is one quarantine row with a reason code and a reason."""
from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memlib.config import IOConfig
from memlib.io.errors import InputError
from memlib.io.readers import input_fingerprints, read_input
from memlib.io.validate import ReasonCode

MAX_CHARS = 300
CFG = IOConfig(max_turn_chars=MAX_CHARS)
CODES = {c.value for c in ReasonCode}
SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

TENANTS = st.sampled_from(["maya", "raj", "t-1.x"])
TIMES = st.sampled_from([None, "2024-01-09", "2024-03-01T10:00:00Z", "2023-12-31T23:59:59+05:30"])
BAD_TIMES = ["the day after never", "31 Smarch", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
             "2024-02-30", "0500-01-01"]
TEXT = st.text(min_size=1, max_size=60).filter(lambda t: t.strip() != "")
EXTRAS = st.none() | st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=8), max_size=3)


@st.composite
def turn(draw) -> dict:
    rec = {"tenant_id": draw(TENANTS), "conversation_id": draw(st.sampled_from(["c1", "c2"])),
           "session_id": draw(st.sampled_from(["s1", "s2", "s3"])), "speaker": draw(st.text(max_size=10)),
           "role": draw(st.sampled_from(["user", "assistant", "other", "User"])), "text": draw(TEXT)}
    when = draw(TIMES)
    if when is not None:
        rec["session_time"] = when
    extras = draw(EXTRAS)
    if extras:
        rec["extras"] = extras
    return rec


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _without(rec: dict, key: str) -> dict:
    return {k: v for k, v in rec.items() if k != key}


# each maps a valid record to one line that must be rejected (bytes for JSONL)
def _line(rec) -> bytes:
    return json.dumps(rec).encode()


JSONL_BAD = {
    "truncated": lambda r, d: _line(r)[: d(st.integers(1, len(_line(r)) - 1))],
    "not_object": lambda r, d: json.dumps(d(st.sampled_from([[1, 2], 7, "text", None, True]))).encode(),
    "missing": lambda r, d: _line(_without(r, d(st.sampled_from(["tenant_id", "conversation_id", "session_id",
                                                                 "turn_id", "text"])))),
    "bad_tenant": lambda r, d: _line({**r, "tenant_id": d(st.sampled_from(["../x", "a b", "maya\n", "", 5]))}),
    "empty_text": lambda r, d: _line({**r, "text": " \t "}),
    "non_string_text": lambda r, d: _line({**r, "text": d(st.sampled_from([42, None, ["x"], {"a": 1}]))}),
    "unknown_role": lambda r, d: _line({**r, "role": "robot"}),
    "bad_date": lambda r, d: _line({**r, "session_time": d(st.sampled_from(BAD_TIMES))}),
    "oversize": lambda r, d: _line({**r, "text": "x" * (MAX_CHARS + 1)}),
    "bad_extras": lambda r, d: _line({**r, "extras": d(st.sampled_from([[1], "not json", 3]))}),
    "deep": lambda r, d: _line(r)[:-1] + b', "x": ' + _deep(d(st.sampled_from([1500, 20_000]))).encode() + b"}",
    "surrogate": lambda r, d: _line({**r, d(st.sampled_from(["text", "turn_id", "speaker"])): "a\ud800b"}),
    "bad_utf8": lambda r, d: _line({**r, "text": "caf-"}).replace(b"caf-", b"caf\xff"),
    "unknown_kind": lambda r, d: _line({**r, "kind": "memo"}),
}


@st.composite
def jsonl_file(draw):
    """(file bytes, valid records, number of rejected lines)."""
    valid, lines, bad = [], [], 0
    for i in range(draw(st.integers(0, 12))):
        rec = {**draw(turn()), "turn_id": f"t{i}"}
        kind = draw(st.sampled_from(["valid"] * 3 + sorted(JSONL_BAD) + ["duplicate", "blank"]))
        if kind == "valid":
            valid.append(rec)
            lines.append(_line(rec))
        elif kind == "blank":
            lines.append(b"   ")
        elif kind == "duplicate":
            if not valid:
                continue
            first = draw(st.sampled_from(valid))
            lines.append(_line({**first, "text": "same id again"}))
            bad += 1
        else:
            lines.append(JSONL_BAD[kind](rec, draw))
            bad += 1
    bom = b"\xef\xbb\xbf" if draw(st.booleans()) else b""
    return bom + b"\n".join(lines) + (b"\n" if draw(st.booleans()) else b""), valid, bad


def _check(result, valid: list[dict], bad: int) -> None:
    kept = {(t["tenant_id"], t["conversation_id"], t["turn_id"]): t["text"] for t in result.turns.to_pylist()}
    assert kept == {(r["tenant_id"], r["conversation_id"], r["turn_id"]): r["text"] for r in valid}
    rows = result.quarantine.to_pylist()
    assert len(rows) == bad, [(r["reason_code"], r["location"]) for r in rows]
    assert all(r["reason_code"] in CODES and r["reason"] and r["location"] for r in rows)


def _fuzz(fmt: str, write: Callable[[Path], object], valid: list[dict], bad: int, *,
          refusable: bool = True) -> None:
    """Read the file ``write`` makes as ``fmt`` and check it (:func:`_check`); a file may be refused
    whole only when ``refusable`` and no record in it is valid."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"in.{'json' if fmt == 'locomo' else fmt}"
        write(path)
        try:
            fps = input_fingerprints(path, fmt, CFG)
            result = read_input(path, fmt, CFG)
        except InputError as exc:
            assert refusable and not valid, f"a {fmt} file refused whole: {exc}"
            return
    assert {r["tenant_id"] for r in valid} <= set(fps)
    _check(result, valid, bad)


@SETTINGS
@given(jsonl_file())
@pytest.mark.heavy
def test_fuzz_jsonl(case):
    data, valid, bad = case
    _fuzz("jsonl", lambda path: path.write_bytes(data), valid, bad)


PARQUET_BAD = {
    "missing": lambda r, d: {**r, d(st.sampled_from(["tenant_id", "conversation_id", "turn_id", "text"])): None},
    "bad_tenant": lambda r, d: {**r, "tenant_id": d(st.sampled_from(["../x", "a b", "maya\n"]))},
    "empty_text": lambda r, d: {**r, "text": "  "},
    "unknown_role": lambda r, d: {**r, "role": "robot"},
    "bad_date": lambda r, d: {**r, "session_time": d(st.sampled_from(BAD_TIMES))},
    "oversize": lambda r, d: {**r, "text": "y" * (MAX_CHARS + 1)},
    "bad_extras": lambda r, d: {**r, "extras": d(st.sampled_from(["[1]", "not json", "{" * 3000]))},
    "unknown_kind": lambda r, d: {**r, "kind": "memo"},
}
COLUMNS = ("tenant_id", "conversation_id", "session_id", "session_time", "turn_id", "speaker", "role", "text",
           "extras", "kind")


@st.composite
def parquet_rows(draw):
    valid, rows, bad = [], [], 0
    for i in range(draw(st.integers(0, 12))):
        rec = {**draw(turn()), "turn_id": f"t{i}"}
        rec["extras"] = json.dumps(rec["extras"]) if "extras" in rec else None
        kind = draw(st.sampled_from(["valid"] * 3 + sorted(PARQUET_BAD) + ["duplicate"]))
        if kind == "valid":
            valid.append(rec)
            rows.append(rec)
        elif kind == "duplicate":
            if not valid:
                continue
            rows.append({**draw(st.sampled_from(valid)), "text": "same id again"})
            bad += 1
        else:
            rows.append(PARQUET_BAD[kind](rec, draw))
            bad += 1
    return rows, valid, bad


@SETTINGS
@given(parquet_rows())
@pytest.mark.heavy
def test_fuzz_parquet(case):
    rows, valid, bad = case
    table = pa.table({c: pa.array([r.get(c) for r in rows], pa.string()) for c in COLUMNS})
    _fuzz("parquet", lambda path: pq.write_table(table, path), valid, bad)


LOCOMO_DATES = ["1:56 pm on 8 May, 2023", "10:04 am on 1 June, 2023"]


@st.composite
def locomo_file(draw):
    """A LoCoMo array: samples with sessions of valid and malformed turns, bad sessions, a bad sample."""
    samples, valid, bad = [], [], 0
    for s in range(draw(st.integers(1, 3))):
        sid, conv, n = f"conv-{s}", {"speaker_a": "Ana", "speaker_b": "Bo"}, 0
        for k in range(1, draw(st.integers(1, 3)) + 1):
            if draw(st.integers(0, 5)) == 0:
                conv[f"session_{k}"] = "not a list"
                conv[f"session_{k}_date_time"] = LOCOMO_DATES[0]
                bad += 1
                continue
            bad_date = draw(st.integers(0, 5)) == 0
            conv[f"session_{k}_date_time"] = "someday" if bad_date else draw(st.sampled_from(LOCOMO_DATES))
            turns = []
            for _ in range(draw(st.integers(0, 4))):
                n += 1
                t = {"speaker": "Ana", "dia_id": f"D{k}:{n}", "text": draw(TEXT)}
                kind = draw(st.sampled_from(["valid", "valid", "no_id", "empty", "number", "not_object"]))
                if kind == "no_id":
                    t.pop("dia_id")
                elif kind == "empty":
                    t["text"] = "   "
                elif kind == "number":
                    t["text"] = 12
                elif kind == "not_object":
                    t = ["x"]
                if kind == "valid" and not bad_date:
                    valid.append({"tenant_id": sid, "conversation_id": sid, "turn_id": t["dia_id"], "text": t["text"]})
                else:
                    bad += 1
                turns.append(t)
            conv[f"session_{k}"] = turns
        samples.append({"sample_id": sid, "conversation": conv, "qa": []})
    if draw(st.booleans()):
        samples.append({"no": "sample"})
        bad += 1
    return json.dumps(samples).encode(), valid, bad


@SETTINGS
@given(locomo_file())
@pytest.mark.heavy
def test_fuzz_locomo_json(case):
    data, valid, bad = case
    _fuzz("locomo", lambda path: path.write_bytes(data), valid, bad, refusable=False)
