"""The tenant operator's reader of staged files (pipelines.shard.StagedFiles) is shared by the
tenant rows a run in the driver builds at once, on threads (pipelines/inline.py)."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.shard import StagedFiles


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
