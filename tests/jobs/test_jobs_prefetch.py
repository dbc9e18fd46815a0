"""A nightly run in the driver reads its rebuilt tenants' published builds while it shards the input
(pipelines/prefetch.py), a bounded number ahead of the tenant rows that take them."""
from __future__ import annotations

import shutil
import sys
import threading
import time

import pytest

from tests.jobs.conftest import ALL, TOPICS, run_cli, tenant_lines, write_jsonl

pytestmark = pytest.mark.ray


def _night(base_store, tmp_path, name: str):
    """A copy of the base store, and an input in which emil and fay changed."""
    store = tmp_path / name
    shutil.copytree(base_store[1], store)
    night = write_jsonl(tmp_path / "night.jsonl", ALL, {"emil": " Again.", "fay": " Again."})
    return store, night


def test_jobs_prefetch_reads_published_builds_while_the_input_is_sharded(base_store, tmp_path, monkeypatch):
    """The sharding of the input waits until the published builds are read: they are, on the
    prefetch thread (before, a tenant row read them once the input was sharded: the wait timed
    out); every rebuilt tenant's row takes its build from there and reuses it."""
    import json

    import jobs.builder.driver as driver
    import jobs.builder.tenants as tenants
    import memlib.compose.reuse as reuse
    from pipelines.prefetch import HANDOFF_S

    store, night = _night(base_store, tmp_path, "ahead")
    before = sys.getswitchinterval()
    monkeypatch.setattr(driver, "_may_inline", lambda run, options: True)
    monkeypatch.setenv("MEMLIB__RAY__INLINE_MAX_TURNS", "400")
    read, calls, switch = threading.Event(), [], []
    real_load, real_shard = reuse.load_previous, tenants.shard_all

    def load_previous(store_dir, tenant, *a, **k):
        out = real_load(store_dir, tenant, *a, **k)
        calls.append((tenant, threading.current_thread().name))
        if len(calls) == 2:
            read.set()
        return out

    def shard_all(*a, **k):  # both builds read (two ahead) before the input is sharded
        calls.append(("sharding", read.wait(30)))
        switch.append(sys.getswitchinterval())
        return real_shard(*a, **k)

    monkeypatch.setattr(reuse, "load_previous", load_previous)
    monkeypatch.setattr(tenants, "shard_all", shard_all)
    res = run_cli(["build", "--incremental", "--input", str(night), "--format", "jsonl", "--out", str(store)])
    assert res.exit_code == 0 and "small run: 2 tenant(s)" in res.output, res.output
    assert ("sharding", True) in calls, calls
    # the GIL handed over often while the input is sharded (the prefetch's short Python stretches)
    assert switch == [HANDOFF_S] and sys.getswitchinterval() == before, (switch, before)
    assert sorted(calls) == [("emil", "memlib-prefetch"), ("fay", "memlib-prefetch"), ("sharding", True)], calls
    manifest = json.loads((store / "manifest.json").read_text(encoding="utf-8"))
    assert sorted(manifest["tenant_reused"]) == ["emil", "fay"], manifest["tenant_reused"]
    assert not any("error" in r for r in manifest["tenant_reused"].values()), manifest["tenant_reused"]


def test_jobs_prefetch_holds_at_most_ahead_builds_and_skips_those_taken(base_store, monkeypatch):
    """With ``ahead=1`` one build is read until it is taken; a tenant asked for before its turn is
    not read ahead (its row reads it); what is read equals load_previous's own reading; closing
    stops the thread and unregisters it."""
    import memlib.compose.reuse as reuse
    from memlib.io.store import read_manifest
    from pipelines.prefetch import PublishedPrefetch, prefetch_order, take_previous

    store = base_store[1]
    manifest = read_manifest(store)
    key = manifest["session_build_key"]
    order = prefetch_order(["gus", "dora", "emil", "nobody"], manifest["tenants"], 512)
    assert order == ["dora", "emil", "gus"]  # published tenants only; small ones by name
    calls = []
    real = reuse.load_previous
    monkeypatch.setattr(reuse, "load_previous", lambda s, t, *a, **k: calls.append(t) or real(s, t, *a, **k))
    prefetch = PublishedPrefetch(store, key, order, ahead=1).start()
    try:
        _until(lambda: calls)
        time.sleep(0.5)
        assert calls == ["dora"], calls  # one ahead: emil waits until dora is taken
        assert take_previous(store, "another key", "dora") is None  # another run's key: not its build
        first = take_previous(store, key, "dora")
        assert first is not None and first.done()
        _until(lambda: len(calls) == 2)
        time.sleep(0.5)
        assert calls == ["dora", "emil"], calls
        assert take_previous(store, key, "gus") is None  # asked before its turn: never read ahead
        emil = take_previous(store, key, "emil")
        assert emil is not None and emil.result(60) is not None
        own = real(store, "dora", key)
        assert first.result(60).rows.equals(own.rows)
    finally:
        prefetch.close()
    assert calls == ["dora", "emil"], calls
    assert take_previous(store, key, "emil") is None  # closed: unregistered


def _until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_jobs_prefetch_reads_the_rows_kept_sessions_once_planned(base_store, tmp_path, monkeypatch):
    """Once the sessions are planned, the prefetch reads each rebuilt tenant's sessions kept by
    earlier runs (before, its row read them); the row reads only this run's sessions, and the store
    is the one a run reading them in the row publishes."""
    import json

    import jobs.builder.driver as driver
    from jobs.cli.bench_nightly import store_snapshot
    from memlib.compose.session_store import SessionStore

    monkeypatch.setattr(driver, "_may_inline", lambda run, options: True)
    monkeypatch.setenv("MEMLIB__RAY__INLINE_MAX_TURNS", "400")
    reads = []
    real_read = SessionStore.read

    def read(self, keys, blocks=None):
        keys = list(keys)
        reads.append((threading.current_thread().name, len(keys)))
        return real_read(self, keys, blocks)

    monkeypatch.setattr(SessionStore, "read", read)
    store, _ = _night(base_store, tmp_path, "kept")
    night = tmp_path / "one_session.jsonl"  # one session of emil and one of fay changed
    lines = [json.loads(line) for t in ALL for line in tenant_lines(t)]
    first = {t: lines[[r["tenant_id"] for r in lines].index(t)]["conversation_id"] for t in ("emil", "fay")}
    for r in lines:
        if first.get(r["tenant_id"]) == r["conversation_id"] and r["turn_id"] == "s2:1":
            r["text"] += " Again."
    night.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    args = ["build", "--incremental", "--input", str(night), "--format", "jsonl", "--out"]
    res = run_cli([*args, str(store)])
    assert res.exit_code == 0 and "small run: 2 tenant(s)" in res.output, res.output
    ahead = [n for t, n in reads if t == "memlib-prefetch-kept"]
    in_rows = [n for t, n in reads if t.startswith("memlib-tenant")]
    assert sorted(ahead) == sorted(2 * len(TOPICS[t]) - 1 for t in ("emil", "fay")), reads  # their kept sessions
    assert len(in_rows) == 2 and max(in_rows) == 1, reads  # each row: its one changed session

    reads.clear()
    monkeypatch.setattr(driver, "_read_kept_ahead", lambda run, sharded: None)  # read in the rows
    again = tmp_path / "in_rows"
    shutil.copytree(base_store[1], again)
    res = run_cli([*args, str(again)])
    assert res.exit_code == 0, res.output
    assert not [t for t, _ in reads if t == "memlib-prefetch-kept"], reads
    (nodes, vectors, edges, np), (nodes2, vectors2, edges2, _) = store_snapshot(store), store_snapshot(again)
    assert nodes.equals(nodes2) and edges.equals(edges2) and len(nodes) > 0
    assert np.array_equal(vectors, vectors2)  # one process, one encoder: the same bits


def test_jobs_prefetch_reads_part_files_apart_and_never_reuses_rows_whose_digest_differs(base_store):
    """A tenant's part files read on another thread (as the prefetch reads the first tenant's while
    lancedb is imported) give the build load_previous reads alone; its Lance rows are hashed while
    the build is made of them, and rows whose digest is not the one published raise, whichever
    finishes first (nothing made of them is returned)."""
    import copy
    from concurrent.futures import ThreadPoolExecutor

    from memlib.compose.reuse import load_previous, read_parts
    from memlib.io.checksums import DamagedFileError
    from memlib.io.reader_checks import forget_rows
    from memlib.io.store import StoreReader, read_manifest

    store = base_store[1]
    manifest = read_manifest(store)
    key, tenant = manifest["session_build_key"], sorted(manifest["tenants"])[0]
    forget_rows()
    reader = StoreReader(store, manifest)
    with ThreadPoolExecutor(1) as pool:
        ahead = load_previous(store, tenant, key, reader=reader, parts=pool.submit(read_parts, reader, tenant))
    alone = load_previous(store, tenant, key, manifest)
    assert ahead.rows.num_rows > 0 and ahead.rows.equals(alone.rows) and ahead.nodes.equals(alone.nodes)
    assert ahead.similar.equals(alone.similar) and ahead.clue_inputs == alone.clue_inputs
    assert sorted(ahead.fallbacks) == sorted(alone.fallbacks) and len(ahead.fallbacks) > 0
    assert (ahead.sums is None) == (alone.sums is None)
    assert alone.sums is None or ahead.sums.ids.tolist() == alone.sums.ids.tolist()
    for damaged in range(2):  # a digest of another row count, then another checksum
        bad = copy.deepcopy(manifest)
        bad["tenants"][tenant]["lance_digest"]["nodes"][damaged] += 1
        forget_rows()
        wrong = StoreReader(store, bad)
        with ThreadPoolExecutor(1) as pool, pytest.raises(DamagedFileError, match="not the ones written"):
            load_previous(store, tenant, key, reader=wrong, parts=pool.submit(read_parts, wrong, tenant))
        with pytest.raises(DamagedFileError, match="not the ones written"):
            load_previous(store, tenant, key, reader=StoreReader(store, bad))
    forget_rows()
