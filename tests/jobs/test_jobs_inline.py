"""A small incremental run builds in the driver process (pipelines/inline.py): no Ray is started,
the store equals the same run on Ray, and one tenant's failure is still that tenant's alone."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.jobs.conftest import ALL, run_cli, tenant_lines, write_jsonl

pytestmark = pytest.mark.ray


def _cli(args: list[str], inline_max_turns: int | None) -> subprocess.CompletedProcess:
    """``memlib ARGS`` in a process of its own (so no Ray is running in it beforehand)."""
    env = {k: v for k, v in os.environ.items() if k != "MEMLIB__RAY__INLINE_MAX_TURNS"}
    if inline_max_turns is not None:
        env["MEMLIB__RAY__INLINE_MAX_TURNS"] = str(inline_max_turns)
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)


def _new_session(tenant: str) -> list[str]:
    """A third session of ``tenant``'s first conversation, a month after its others."""
    lines = [json.loads(x) for x in tenant_lines(tenant) if json.loads(x)["session_id"] == "s2"]
    conv = lines[0]["conversation_id"]
    out = []
    for row in (r for r in lines if r["conversation_id"] == conv):
        out.append(json.dumps({**row, "session_id": "s3", "turn_id": row["turn_id"].replace("s2", "s3"),
                               "session_time": "2023-03-20T10:00:00+00:00",
                               "text": row["text"] + " We went back to it in March."}))
    return out


@pytest.fixture(scope="module")
def nightly(tmp_path_factory) -> dict[str, Path]:
    """A full build of the four tenants (its own process, on Ray), and an input in which two of
    them have one more session."""
    d = tmp_path_factory.mktemp("inline")
    base = write_jsonl(d / "base.jsonl", ALL)
    store = d / "store"
    res = _cli(["build", "--input", str(base), "--format", "jsonl", "--out", str(store), "--num-cpus", "2"], 0)
    assert res.returncode == 0, res.stdout + res.stderr
    night = d / "night.jsonl"
    night.write_text(base.read_text(encoding="utf-8") + "\n".join(_new_session("emil") + _new_session("fay")) + "\n",
                     encoding="utf-8")
    return {"dir": d, "store": store, "input": night}


def _copy(nightly: dict[str, Path], name: str) -> Path:
    out = nightly["dir"] / name
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(nightly["store"], out)
    return out


def test_jobs_inline_small_nightly_starts_no_ray_and_equals_the_ray_run(nightly):
    from jobs.cli.bench_nightly import compare_stores

    inline, on_ray = _copy(nightly, "inline"), _copy(nightly, "on_ray")
    args = ["build", "--incremental", "--input", str(nightly["input"]), "--format", "jsonl", "--num-cpus", "2"]
    a = _cli([*args, "--out", str(inline)], None)  # the default limits
    b = _cli([*args, "--out", str(on_ray)], 0)     # always Ray
    assert a.returncode == 0 and b.returncode == 0, a.stdout + a.stderr + b.stdout + b.stderr
    assert "small run: 2 tenant(s), 8 turns to compute, built in this process" in a.stdout, a.stdout
    assert "starting Ray" not in a.stdout and "\nray: " not in a.stdout, a.stdout
    assert "starting Ray" in b.stdout and "small run" not in b.stdout, b.stdout
    ma = json.loads((inline / "manifest.json").read_text(encoding="utf-8"))
    mb = json.loads((on_ray / "manifest.json").read_text(encoding="utf-8"))
    assert ma["sessions"]["inline"] is True and "inline" not in mb["sessions"]
    assert "ray_start" not in ma["stage_timings_s"] and "ray_start" in mb["stage_timings_s"]
    assert ma["sessions"]["sessions_computed"] == mb["sessions"]["sessions_computed"] == 2
    assert sorted(ma["tenant_reused"]) == ["emil", "fay"] and ma["tenant_reused"]["emil"]["appended_only"] == 1
    same = compare_stores(inline, on_ray)
    assert same["equal_to_full_build"] and same["max_vector_diff"] == 0.0, same


def test_jobs_inline_one_failing_tenant_is_reported_and_the_others_published(nightly, monkeypatch):
    """Forced in-process (this test process may have joined a Ray already), one tenant's stages
    raise: it keeps its published data and is reported by name; the other is built."""
    import jobs.builder.driver as driver
    import memlib.compose.reference as reference
    from memlib.io.store import StoreReader

    store = _copy(nightly, "failing")
    real = reference.tenant_steps

    def failing(tenant, *args, **kwargs):
        if tenant.turns.column("tenant_id")[0].as_py() == "fay":
            raise RuntimeError("injected failure of fay's tenant stage")
        return real(tenant, *args, **kwargs)

    monkeypatch.setattr(reference, "tenant_steps", failing)
    monkeypatch.setattr(driver, "_may_inline", lambda run, options: True)
    monkeypatch.setenv("MEMLIB__RAY__INLINE_MAX_TURNS", "400")
    before = StoreReader(store).nodes(columns=["node_id", "tenant_id"])
    res = run_cli(["build", "--incremental", "--input", str(nightly["input"]), "--format", "jsonl",
                   "--out", str(store)])
    assert "small run: 2 tenant(s)" in res.output, res.output
    assert "tenant fay FAILED" in res.output and "injected failure of fay's tenant stage" in res.output, res.output
    manifest = json.loads((store / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["version"] == "v000002" and manifest["sessions"]["inline"] is True
    after = StoreReader(store).nodes(columns=["node_id", "tenant_id"])
    ids = lambda t, who: {n for n, x in zip(t.column("node_id").to_pylist(), t.column("tenant_id").to_pylist())  # noqa: E731
                          if x == who}
    assert ids(after, "fay") == ids(before, "fay")          # kept as published
    assert ids(after, "emil") > ids(before, "emil")          # its new session's nodes added
    assert ids(after, "dora") == ids(before, "dora")


def test_jobs_inline_fits_only_small_incremental_runs_without_an_llm():
    from memlib.config import Backend, MemlibConfig
    from pipelines.context import BuildContext
    from pipelines.inline import inline_fits

    cfg = MemlibConfig()
    ctx = BuildContext(cfg, reuse=True)
    assert inline_fits(ctx, 3, None) and inline_fits(ctx, 3, 400)
    assert not inline_fits(ctx, 3, 401)                                    # too many turns to compute
    assert not inline_fits(ctx, 17, 10)                                    # too many tenants
    assert not inline_fits(ctx, 0, 0)                                      # nothing to build
    assert not inline_fits(BuildContext(cfg, reuse=False), 3, 10)          # a full build
    off = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"inline_max_turns": 0})})
    assert not inline_fits(BuildContext(off, reuse=True), 1, 1)
    llm = cfg.model_copy(update={"facts": cfg.facts.model_copy(update={"backend": Backend.LLM})})
    assert not inline_fits(BuildContext(llm, reuse=True), 1, 1)            # its calls share a Ray actor


_IN_PROCESS = """
import json, sys
from jobs.cli import run
code = run(sys.argv[1:])
print("LOADED " + json.dumps({m: m in sys.modules for m in ("ray", "lance_namespace_urllib3_client.api")}))
sys.exit(code)
"""


def test_jobs_inline_run_imports_no_ray_nor_lances_rest_client_and_writes_token_sums_lz4(nightly):
    """What a run in the driver leaves out (docs/decisions/0040-nightly-part-costs.md): Ray is
    never imported, nor the REST client lancedb's import would run; token_sums and node_fallbacks
    parts are LZ4 (the others zstd; decision 0066), and the store still equals the same run on Ray
    (test above)."""
    import pyarrow.parquet as pq

    from memlib.io.store import StoreReader

    store = _copy(nightly, "lean")
    env = {k: v for k, v in os.environ.items() if k != "MEMLIB__RAY__INLINE_MAX_TURNS"}
    res = subprocess.run([sys.executable, "-c", _IN_PROCESS, "build", "--incremental", "--input",
                          str(nightly["input"]), "--format", "jsonl", "--out", str(store)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "built in this process" in res.stdout, res.stdout
    loaded = json.loads(res.stdout.split("LOADED ")[1].splitlines()[0])
    assert loaded == {"ray": False, "lance_namespace_urllib3_client.api": False}, loaded
    version = StoreReader(store).version_dir
    codecs = {}
    for name in ("token_sums", "node_fallbacks", "edges", "turns"):
        files = sorted((version / name).glob("*.parquet"))
        meta = pq.ParquetFile(files[-1]).metadata
        codecs[name] = {meta.row_group(0).column(i).compression for i in range(meta.num_columns)}
    assert codecs == {"token_sums": {"LZ4"}, "node_fallbacks": {"LZ4"}, "edges": {"ZSTD"}, "turns": {"ZSTD"}}, codecs


def test_jobs_inline_tenant_stages_run_graph_tools_kernels_on_one_thread():
    """As a tenant actor does (Ray gives an actor of a quarter CPU OMP_NUM_THREADS=1); the
    process's setting is restored after."""
    from memlib.graph.ppr import openmp_threads
    from pipelines.inline import one_kernel_thread

    before = openmp_threads(2)
    try:
        with one_kernel_thread():
            assert openmp_threads() == 1
        assert openmp_threads() == 2
    finally:
        openmp_threads(before)


def test_jobs_inline_builds_tenant_rows_at_once_and_the_store_equals_one_at_a_time(nightly, monkeypatch):
    """With one tenant a row, the two touched tenants' rows are built on two threads at the same time
    (each row waits at a barrier for the other: one after another, the first would time out there),
    each thread running graph-tool's kernels on one thread, and the store equals the same run with
    one row at a time."""
    import threading

    import jobs.builder.driver as driver
    import pipelines.inline as inline
    import pipelines.tenant_op as tenant_op
    from jobs.cli.bench_nightly import compare_stores
    from memlib.graph.ppr import openmp_threads

    monkeypatch.setattr(driver, "_may_inline", lambda run, options: True)
    monkeypatch.setenv("MEMLIB__RAY__INLINE_MAX_TURNS", "400")
    monkeypatch.setenv("MEMLIB__RAY__TENANT_BATCH_TURNS", "1")
    args = ["build", "--incremental", "--input", str(nightly["input"]), "--format", "jsonl", "--out"]
    real, barrier, threads = tenant_op.TenantOp.build_row, threading.Barrier(2, timeout=60), set()

    def meeting(self, items):
        threads.add((threading.current_thread().name, openmp_threads()))
        barrier.wait()  # BrokenBarrierError unless the other row is being built too
        return real(self, items)

    with monkeypatch.context() as m:
        m.setattr(tenant_op.TenantOp, "build_row", meeting)
        together = _copy(nightly, "together")
        res = run_cli([*args, str(together)])
        assert res.exit_code == 0 and "small run: 2 tenant(s)" in res.output, res.output
    # two worker threads, each with graph-tool's kernels on one thread (as a tenant actor on Ray)
    assert len(threads) == 2 and {n for _, n in threads} == {1} and ("MainThread", 1) not in threads, threads
    monkeypatch.setattr(inline, "tenant_workers", lambda cpus, rows: 1)
    alone = _copy(nightly, "alone")
    res = run_cli([*args, str(alone)])
    assert res.exit_code == 0, res.output
    same = compare_stores(together, alone)
    assert same["equal_to_full_build"] and same["max_vector_diff"] == 0.0, same


def test_jobs_cli_process_freezes_its_objects_before_it_exits():
    """``memlib`` (jobs.cli.main) freezes the garbage collector's objects once its command is done,
    so the interpreter's exit does not collect them (0.6-0.7 s of a nightly run's process)."""
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('FROZEN', gc.get_freeze_count()))\n"
            "sys.argv = ['memlib', '--version']\n"
            "from jobs.cli import main\n"
            "main()\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "memlib" in res.stdout, res.stdout + res.stderr
    frozen = int(res.stdout.split("FROZEN ")[1].split()[0])
    assert frozen > 10_000, res.stdout


def _forced_inline(monkeypatch) -> list[str]:
    """The arguments of a forced in-process nightly run of one tenant a row (less the store)."""
    import jobs.builder.driver as driver

    monkeypatch.setattr(driver, "_may_inline", lambda run, options: True)
    monkeypatch.setenv("MEMLIB__RAY__INLINE_MAX_TURNS", "400")
    monkeypatch.setenv("MEMLIB__RAY__TENANT_BATCH_TURNS", "1")
    return ["build", "--incremental", "--input", "", "--format", "jsonl", "--out"]


def test_jobs_inline_tenant_rows_start_while_the_session_pass_runs(nightly, monkeypatch):
    """A tenant row reads its published build and kept sessions while this run's block is still in
    the session pass, then waits for it, as a tenant actor does on Ray: the block's pass holds
    until a tenant row waits for it (a row started only after the pass would never come)."""
    import threading

    import pipelines.operators as operators
    import pipelines.tenant_op as tenant_op

    args = _forced_inline(monkeypatch)
    args[3] = str(nightly["input"])
    waiting, saw = threading.Event(), []
    real_wait, real_block = tenant_op.TenantOp.wait_for_blocks, operators.SessionLocalOp.run_block

    def wait_for_blocks(self, blocks, work):
        waiting.set()
        return real_wait(self, blocks, work)

    def run_block(self, *a, **k):
        saw.append(waiting.wait(60))
        return real_block(self, *a, **k)

    monkeypatch.setattr(tenant_op.TenantOp, "wait_for_blocks", wait_for_blocks)
    monkeypatch.setattr(operators.SessionLocalOp, "run_block", run_block)
    store = _copy(nightly, "early")
    res = run_cli([*args, str(store)])
    assert res.exit_code == 0 and "2 tenant(s)" in res.output, res.output
    assert saw == [True], saw


def test_jobs_inline_a_session_pass_that_raises_stops_the_waiting_tenant_rows(nightly, monkeypatch):
    """The session pass raising (not one block's failure, which its tenants read from the block's
    marker) ends the run at once: the tenant rows waiting for its blocks are stopped, not left to
    wait ray.tenant_wait_s."""
    import time

    import pipelines.operators as operators

    args = _forced_inline(monkeypatch)
    args[3] = str(nightly["input"])
    monkeypatch.setenv("MEMLIB__RAY__TENANT_WAIT_S", "600")

    def boom(self, batch):
        time.sleep(3)  # the tenant rows are waiting by now
        raise RuntimeError("injected failure of the session pass")

    monkeypatch.setattr(operators.SessionPassOp, "__call__", boom)
    store = _copy(nightly, "stopped")
    started = time.perf_counter()
    res = run_cli([*args, str(store)])
    assert res.exit_code != 0 and "injected failure of the session pass" in repr(res.exception), res.output
    assert time.perf_counter() - started < 120
    assert json.loads((store / "manifest.json").read_text(encoding="utf-8"))["version"] == "v000001"


def test_jobs_inline_prewarm_freezes_what_it_loaded(tmp_path):
    """The warm-up thread's loads (models, spaCy, lancedb) live as long as the process: frozen once
    loaded, the collector's full passes (which stop every thread) no longer walk them."""
    code = ("import gc, sys\n"
            "from memlib.config import MemlibConfig\n"
            "from pipelines.context import BuildContext\n"
            "from pipelines.inline import prewarm\n"
            "before = gc.get_freeze_count()\n"
            f"prewarm(BuildContext(MemlibConfig(), store={str(tmp_path)!r}, reuse=True))\n"
            "print('FROZEN', before, gc.get_freeze_count())\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    before, after = (int(x) for x in res.stdout.split("FROZEN ")[1].split()[:2])
    assert before == 0 and after > 100_000, res.stdout


def test_jobs_inline_prewarm_loads_without_collections(tmp_path):
    """While the warm-up loads, the cyclic collector makes no pass (each stopped every thread: the
    sharding and the read-ahead too); afterwards its thresholds are what they were."""
    code = ("import gc\n"
            "from memlib.config import MemlibConfig\n"
            "from pipelines.context import BuildContext\n"
            "from pipelines.inline import prewarm\n"
            f"ctx = BuildContext(MemlibConfig(), store={str(tmp_path)!r}, reuse=True)\n"
            "passes = []\n"  # counted from here: the context's allocations may start one before
            "gc.callbacks.append(lambda phase, info: phase == 'start' and passes.append(info['generation']))\n"
            "prewarm(ctx)\n"
            "print('PASSES', len(passes), gc.get_threshold() == (700, 10, 10))\n"
            "gc.set_threshold(5000, 7, 9)\n"
            "prewarm(ctx)\n"
            "print('SET', gc.get_threshold())\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASSES 0 True" in res.stdout and "SET (5000, 7, 9)" in res.stdout, res.stdout


_NUMBA_AFTER = """
import sys
from jobs.cli import run
code = run(sys.argv[1:])
print("NUMBA", "numba" in sys.modules)
sys.exit(code)
"""


def _big_new_tenant(sessions: int) -> list[str]:
    """A tenant of ``sessions`` sessions of four turns each, none of them published."""
    lines = []
    for si in range(sessions):
        for ti, text in enumerate([f"On day {si} I rowed {si + 3} kilometres on the Vltava before work.",
                                   "How did your shoulders feel afterwards?",
                                   f"Sore, but the coach says week {si % 7} always is.", "Keep it up!"], 1):
            lines.append(json.dumps({"tenant_id": "hal", "conversation_id": "hal-a", "session_id": f"s{si}",
                                     "session_time": f"2023-{1 + si // 28:02d}-{1 + si % 28:02d}T09:00:00+00:00",
                                     "turn_id": f"s{si}:{ti}", "speaker": "Hal" if ti % 2 else "Bot",
                                     "role": "user" if ti % 2 else "assistant", "text": text}))
    return lines


def test_jobs_inline_nightly_imports_numba_only_for_a_tenant_built_whole(nightly):
    """A nightly whose tenants add a session pools their few new rows in numpy: numba is never
    imported (neither by the warm-up thread nor by the tenant operator); one that brings a big new
    tenant (pooled whole, memlib.compose.pool_kernels.pools_big) loads numba's loops
    (docs/decisions/0060-numba-only-for-big-pooling.md)."""
    from memlib.compose.pool_kernels import pools_big

    assert pools_big(4 * 45, 384) and not pools_big(4 * 40, 384)
    env = {k: v for k, v in os.environ.items() if k != "MEMLIB__RAY__INLINE_MAX_TURNS"}
    new_tenant = nightly["dir"] / "new_tenant.jsonl"
    new_tenant.write_text(nightly["input"].read_text(encoding="utf-8") + "\n".join(_big_new_tenant(45)) + "\n",
                          encoding="utf-8")
    loaded = {}
    for name, night in (("appends", nightly["input"]), ("new_tenant", new_tenant)):
        res = subprocess.run([sys.executable, "-c", _NUMBA_AFTER, "build", "--incremental", "--input", str(night),
                              "--format", "jsonl", "--out", str(_copy(nightly, f"numba_{name}"))],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "built in this process" in res.stdout, res.stdout
        loaded[name] = res.stdout.split("NUMBA ")[1].split()[0]
    assert loaded == {"appends": "False", "new_tenant": "True"}, loaded
