"""Streaming by tenant, Parquet parity and fingerprints."""
from __future__ import annotations

import inspect
import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memlib.io import readers
from memlib.io.readers import input_fingerprints, iter_tenants, read_input


def _rows(tenant: str, n: int, start: int = 0) -> list[dict]:
    return [{"tenant_id": tenant, "conversation_id": "c", "session_id": "s1", "session_time": "2024-05-01T12:00:00",
             "turn_id": f"{tenant}-{i}", "speaker": "u", "role": "user", "text": f"{tenant} says {i}"}
            for i in range(start, start + n)]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_iter_tenants_is_lazy_and_one_tenant_each(locomo_path):
    gen = iter_tenants(locomo_path, "locomo")
    assert inspect.isgenerator(gen)
    first = next(gen)
    assert first.tenant_ids == ["conv-26"]
    assert [r.tenant_ids for r in gen] == [["conv-30"], ["conv-41"]]


def test_jsonl_interleaved_tenants_are_grouped(tmp_path):
    rows = _rows("a", 2) + _rows("b", 3) + _rows("a", 2, start=2) + ["not json"]
    path = tmp_path / "x.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    results = list(iter_tenants(path, "jsonl"))
    assert [r.tenant_ids for r in results] == [["a"], ["b"]]
    assert results[0].turns.column("turn_index").to_pylist() == [0, 1, 2, 3]
    # the trailing bad line belongs to the run it ends (tenant a's second run)
    assert results[0].quarantine.column("location").to_pylist() == ["line 8"]


def test_parquet_matches_jsonl(tmp_path, bad_jsonl, io_cfg):
    good = [json.loads(line) for line in bad_jsonl.read_bytes().splitlines()
            if line.startswith(b'{"tenant_id": "acme"') and line.endswith(b"}") and b"Smarch" not in line
            and b"\xe9" not in line and b'"kind"' not in line and b'"turn_id"' in line]
    for r in good:
        r["text"] = r["text"] if isinstance(r["text"], str) else None  # Parquet columns are typed
        r["extras"] = json.dumps(r["extras"]) if "extras" in r else None
    path = tmp_path / "x.parquet"
    pq.write_table(pa.Table.from_pylist(good), path)
    pq_result = read_input(path, "parquet", io_cfg)
    js_result = read_input(bad_jsonl, "jsonl", io_cfg)
    assert pq_result.turns.equals(js_result.turns)
    assert sorted(pq_result.quarantine.column("reason_code").to_pylist()) == \
        ["duplicate_turn_id", "empty_text", "non_string_text", "oversize_turn", "unknown_role"]
    assert pq_result.quarantine.column("location").to_pylist()[0].startswith("row ")


def test_fingerprints_change_only_for_edited_tenant(tmp_path):
    rows = _rows("a", 3) + _rows("b", 3)
    before = input_fingerprints(_write(tmp_path / "1.jsonl", rows), "jsonl")
    rows[4]["text"] = "b changed their mind"
    after = input_fingerprints(_write(tmp_path / "2.jsonl", rows), "jsonl")
    assert set(before) == {"a", "b"} and before["a"] == after["a"] and before["b"] != after["b"]
    assert all(len(v) == 64 for v in after.values())


def test_locomo_fingerprints_stable(locomo_path):
    one = readers.input_fingerprints(locomo_path, "locomo")
    assert list(one) == ["conv-26", "conv-30", "conv-41"]
    assert one == readers.input_fingerprints(locomo_path, readers.InputFormat.LOCOMO)


def _per_tenant(results) -> dict[str, tuple]:
    """Tenant -> its (turns, questions) rows and quarantine locations, from results of any grouping."""
    out = {}
    for r in results:
        for tenant in r.tenant_ids:
            of = lambda t, who=tenant: t.filter(pc.equal(t.column("tenant_id"), who)).to_pylist()  # noqa: E731
            out[tenant] = (of(r.turns), of(r.questions), sorted(of(r.quarantine), key=lambda q: q["location"]))
    return out


def test_batches_hold_whole_tenants_with_the_tables_of_one_by_one(tmp_path, monkeypatch):
    """The build reads tenants in batches (a bounded size, a large tenant alone); each tenant's
    turns, questions and quarantine rows are exactly those of reading it alone, in JSONL (with
    interleaved runs and a bad line) and in Parquet."""
    rows = _rows("a", 2) + _rows("b", 3) + _rows("a", 2, start=2) + _rows("c", 1) + _rows("big", 40) + _rows("d", 2)
    rows[6]["role"] = "robot"  # quarantined in tenant c's batch
    path = _write(tmp_path / "x.jsonl", rows)
    one_by_one = list(iter_tenants(path, "jsonl"))
    monkeypatch.setattr(readers, "BATCH_BYTES", 1500)
    batches = list(readers.iter_batches(path, "jsonl"))
    assert [r.tenant_ids for r in batches] == [["a", "b", "c"], ["big"], ["d"]]
    assert _per_tenant(batches) == _per_tenant(one_by_one)
    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in rows[0]} for r in rows]), tmp_path / "x.parquet")
    monkeypatch.setattr(readers, "BATCH_ROWS", 10)
    batches = list(readers.iter_batches(tmp_path / "x.parquet", "parquet"))
    assert [sorted(r.tenant_ids) for r in batches] == [["a", "b", "c"], ["big"], ["d"]]
    assert _per_tenant(batches) == _per_tenant(iter_tenants(tmp_path / "x.parquet", "parquet"))


def test_parquet_fingerprints_are_per_tenant_records(tmp_path):
    """Parquet fingerprints read batches of tenants, and a tenant's hash still covers its records
    alone: another tenant's edit does not change it."""
    rows = _rows("a", 3) + _rows("b", 2)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "x.parquet")
    before = input_fingerprints(tmp_path / "x.parquet", "parquet")
    rows[4]["text"] = "b edited"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "x.parquet")
    after = input_fingerprints(tmp_path / "x.parquet", "parquet")
    assert before["a"] == after["a"] and before["b"] != after["b"] and set(before) == {"a", "b"}


def test_a_file_fingerprinted_then_read_is_indexed_once(tmp_path, monkeypatch):
    """The build's fingerprint pass indexes the file; its sharding reads it by that index: two
    passes over the file, not three."""
    from memlib.io import generic

    opened, real = [], generic.open_checked
    monkeypatch.setattr(generic, "open_checked", lambda p: opened.append(p) or real(p))
    path = _write(tmp_path / "x.jsonl", _rows("a", 3) + _rows("b", 2))
    fps = input_fingerprints(path, "jsonl")
    batches = list(readers.iter_batches(path, "jsonl"))
    assert set(fps) == {"a", "b"} and [b.tenant_ids for b in batches] == [["a", "b"]]
    assert len(opened) == 2, opened


def test_a_file_rewritten_after_its_fingerprints_is_read_anew_or_refused(tmp_path):
    """A file written again since it was indexed is indexed again (its new records are read); one
    changed in place with its size and mtime put back is refused by the runs' hashes, never read
    by a stale index."""
    import os

    import pytest

    from memlib.io.errors import InputError

    path = _write(tmp_path / "x.jsonl", _rows("a", 3))
    input_fingerprints(path, "jsonl")
    _write(path, _rows("a", 4))
    assert read_input(path, "jsonl").turns.num_rows == 4
    input_fingerprints(path, "jsonl")
    st = os.stat(path)
    path.write_bytes(path.read_bytes().replace(b"a says 0", b"a said 0"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size
    with pytest.raises(InputError, match="file changed while it was read"):
        list(readers.iter_batches(path, "jsonl"))
