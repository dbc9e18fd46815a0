"""The tenant operator's reader of staged files (pipelines.shard.StagedFiles) is shared by the
tenant rows a run in the driver builds at once, on threads (pipelines/inline.py)."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.shard import StagedFiles, by_tenant, tenant_runs


def test_staged_files_read_by_one_thread_at_a_time_give_each_tenant_its_rows(tmp_path, monkeypatch):
    """Two threads asking for two files with room for one: the second waits for the first's read and
    cache update (a spy on the real reader waits for an overlapping read, which never comes), and
    each gets its tenant's rows in file order."""
    paths = []
    for i in range(2):
        t = pa.table({"tenant_id": ["b", "a", "b", "a"], "text": [f"{i}-{j}" for j in range(4)]})
        paths.append(tmp_path / f"staged{i}.parquet")
        pq.write_table(t, paths[-1])
    real, inside, overlapped = pq.read_table, threading.Event(), []

    def spy(*args, **kwargs):
        if inside.is_set():  # a read started while another is still going
            overlapped.append(True)
        inside.set()
        try:
            threading.Event().wait(0.3)  # room for the other thread's read to start
            return real(*args, **kwargs)
        finally:
            inside.clear()

    monkeypatch.setattr(pq, "read_table", spy)
    staged = StagedFiles(keep=1)
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda p: staged.rows(p, "a").column("text").to_pylist(), paths))
    assert not overlapped
    assert got == [["0-1", "0-3"], ["1-1", "1-3"]]


def test_staged_tables_are_handed_over_until_their_file_is_replaced(tmp_path, monkeypatch):
    """The table a driver staged is what it reads there (no read back); a file replaced since is read."""
    from memlib import schema
    from memlib.io.files import replace_parquet
    from pipelines import shard

    class Writer:
        version_dir = tmp_path

    table = schema.conform(pa.table({
        "tenant_id": ["a"], "conversation_id": ["c"], "session_id": ["s"], "session_index": [1], "turn_id": ["1"],
        "turn_index": [0], "node_id": ["n"], "role": ["user"], "text": ["hi"], "content_hash": ["h"]}), schema.TURNS)
    path = shard._stage(Writer(), "turns", "batch", table, schema.TURNS)
    reads = []
    real = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: reads.append(a) or real(*a, **k))
    assert shard.read_staged(path) is table
    assert shard.staged_rows(path, "a", ["text"]).column("text").to_pylist() == ["hi"]
    assert StagedFiles().rows(path, "a").column("text").to_pylist() == ["hi"] and not reads
    replace_parquet(table.set_column(table.schema.get_field_index("text"), "text", pa.array(["new"])), path)
    assert shard.read_staged(path).column("text").to_pylist() == ["new"] and len(reads) == 1


def test_a_table_in_tenant_order_is_not_copied_and_its_runs_are_each_tenants_rows():
    ordered = pa.table({"tenant_id": ["a", "a", "b", "c", "c", "c"], "x": list(range(6))})
    assert by_tenant(ordered) is ordered
    assert tenant_runs(ordered) == {"a": (0, 2), "b": (2, 1), "c": (3, 3)}
    mixed = pa.table({"tenant_id": ["c", "a", "c", "b", "a"], "x": list(range(5))})
    got = by_tenant(mixed)
    assert got.equals(mixed.sort_by([("tenant_id", "ascending")]))
    assert got.column("x").to_pylist() == [1, 4, 3, 0, 2]  # stable: each tenant's rows in their order
    assert tenant_runs(got) == {"a": (0, 2), "b": (2, 1), "c": (3, 2)}
    assert tenant_runs(mixed.slice(0, 0)) == {} and by_tenant(mixed.slice(0, 1)).num_rows == 1
