"""Ray's own cost for a build: the build's operator graph run with callables that do nothing.

``memlib bench build --ray-overhead`` runs, each in a fresh process with a fresh local Ray
instance started as a build starts one (:func:`jobs.local_ray.start_local`, the operators'
worker environment inherited):

- ``graph``: the build's four operators (turn nodes fused into the embed actors, the session-local
  actors, the tenant actors) with the same actor counts and CPU reservations
  (:func:`pipelines.staged_build.resources`) over as many one-row blocks as the build had rows;
- ``minimal``: the smallest pipeline that still has an actor pool, one actor per core.

Each reports its wall time (from ``ray.init``, its imports done, to the last row) and the CPU seconds of the
process and every process it started (GCS, raylet, agents, workers), read before Ray is shut
down. No model, spaCy pipeline, graph-tool or memlib stage is loaded: what is measured is what any
work on this Ray costs before it starts. A build cannot be faster than its CPU seconds spread over
the cores, so ``(graph CPU + embed CPU + session-local CPU) / (cores x floor)`` bounds
``floor_ratio`` from below for this machine and this design.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import psutil


def _passthrough(batch):
    return batch


class _Passthrough:
    def __call__(self, batch):
        return batch


def _tree_cpu_s() -> float:
    """User and system seconds of this process and its descendants, reaped children included."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _measure(num_cpus: int, actors: dict[str, Any], rows: int, minimal: bool) -> dict[str, float]:
    import pyarrow as pa
    import ray

    from jobs.local_ray import start_local
    from pipelines.operators import WORKER_ENV

    # from here, as a build's time starts once its driver has imported Ray (bench build's build_s)
    start, cpu0 = time.perf_counter(), _tree_cpu_s()
    start_local(num_cpus, worker_env=WORKER_ENV)
    try:
        up = time.perf_counter() - start
        table = pa.table({"row": list(range(rows))})
        ds = ray.data.from_blocks([table.slice(i, 1) for i in range(rows)])
        common = {"batch_size": 1, "batch_format": "pyarrow"}
        pool = ray.data.ActorPoolStrategy
        if minimal:
            ds = ds.map_batches(_Passthrough, num_cpus=1, compute=pool(size=num_cpus), **common)
        else:
            ds = ds.map_batches(_passthrough, num_cpus=actors["embed_cpus"], **common)
            ds = ds.map_batches(_Passthrough, num_cpus=actors["embed_cpus"], compute=pool(size=actors["embed_actors"]),
                                **common)
            ds = ds.map_batches(_Passthrough, num_cpus=actors["session_cpus"],
                                compute=pool(size=actors["session_actors"]), **common)
            ds = ds.map_batches(_Passthrough, num_cpus=actors["tenant_cpus"],
                                compute=pool(size=actors["tenant_actors"], max_tasks_in_flight_per_actor=1), **common)
        n = sum(1 for _ in ds.iter_rows())
        wall = time.perf_counter() - start
        if n != rows:
            raise RuntimeError(f"the empty pipeline returned {n} rows of {rows}")
        return {"ray_up_s": up, "wall_s": wall, "cpu_s": _tree_cpu_s() - cpu0}
    finally:
        ray.shutdown()


def _child(conn, *args) -> None:
    try:
        conn.send(("ok", _measure(*args)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def measure_fresh(num_cpus: int, actors: dict[str, Any], rows: int, minimal: bool) -> dict[str, float]:
    """:func:`_measure` in a new process (a fresh interpreter: its imports and Ray's start count)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, num_cpus, actors, rows, minimal))
    proc.start()
    child.close()
    try:
        status, value = parent.recv()
    except EOFError:
        status, value = "error", f"the measuring process died (exit code {proc.exitcode})"
    proc.join()
    if status != "ok":
        raise RuntimeError(f"measuring Ray's overhead failed: {value}")
    return value


def ray_overhead(cfg, num_cpus: int, blocks: int, tenants: int, turns: int) -> dict[str, Any]:
    """Wall and CPU seconds of the build's operator graph and of the minimal pipeline, empty."""
    from pipelines.operators import SessionLocalOp, TenantOp
    from pipelines.staged_build import resources

    res = resources(cfg, num_cpus, blocks, tenants, turns)
    actors = {"embed_actors": res.embed_actors, "embed_cpus": res.embed_cpus,
              "session_actors": res.session_actors, "session_cpus": SessionLocalOp.num_cpus,
              "tenant_actors": res.tenant_actors, "tenant_cpus": TenantOp.num_cpus}
    rows = max(1, blocks + tenants)
    graph = measure_fresh(num_cpus, actors, rows, minimal=False)
    smallest = measure_fresh(num_cpus, actors, rows, minimal=True)
    return {"rows": rows, "actors": res.embed_actors + res.session_actors + res.tenant_actors,
            **{f"graph_{k}": round(v, 2) for k, v in graph.items()},
            **{f"minimal_{k}": round(v, 2) for k, v in smallest.items()}}


def floor_ratio_bound(overhead_cpu_s: float, work_cpu_s: float, cores: int, floor_s: float) -> float:
    """The least ``floor_ratio`` a build can have when ``overhead_cpu_s`` and ``work_cpu_s`` must run
    on ``cores`` cores: every core busy from start to end, nothing else costing anything."""
    return (overhead_cpu_s + work_cpu_s) / (max(1, cores) * floor_s)
