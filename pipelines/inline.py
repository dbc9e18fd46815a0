"""The staged build's operators run one after another in the driver process, without Ray.

A nightly run that computes a few new sessions of a few tenants spends most of its time on
Ray: the local instance's start (4 s here), the actors' processes (each imports ``ray.data``
and memlib, 1.5-2 CPU-s; Ray Data adds three actors of its own) and its stop (1.3 s), against
a second or two of work (docs/decisions/0032-inline-small-runs.md). :func:`run_inline` passes
the same rows through the same operator classes (:data:`pipelines.operators.FEW_BLOCK_OPERATORS`)
in this process: every block first, then the tenants (one tenant row per core at once:
:func:`tenant_workers`), so a tenant never waits for a block. The outputs are the same functions
of the same inputs; a tenant's or a block's failure is reported in its summary, as on Ray.
:func:`inline_fits` says when a run is small enough.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pyarrow as pa

from pipelines.context import BuildContext
from pipelines.rows import ROW_SCHEMA, RowKind, rows
from pipelines.shard import TenantShard


def inline_fits(ctx: BuildContext, tenants: int, pending_turns: int | None) -> bool:
    """Whether a run may build in the driver: incremental, no LLM step, at most
    ``ray.inline_max_tenants`` tenants to build and, when known, at most ``ray.inline_max_turns``
    turns to compute (None: not known yet, the tenants' count alone decides)."""
    from pipelines.llm_actors import llm_steps

    r = ctx.cfg.ray
    if not ctx.reuse or tenants == 0 or r.inline_max_turns == 0 or tenants > r.inline_max_tenants:
        return False
    if llm_steps(ctx.cfg, ctx.recipe):  # its calls share one rate limiter, a Ray actor
        return False
    return pending_turns is None or pending_turns <= r.inline_max_turns


def prewarm(ctx: BuildContext) -> None:
    """Load what making the operators loads, in the order the run needs it: the encoder (the
    embed pass's, cached per process), spaCy and the drafted extractors, then what only the tenant
    stages use (their modules, graph-tool, lancedb; numba's pooling loops only when tenants are
    pooled whole: decision 0060). Called on a thread while
    the driver shards the input of a run that may build inline; the driver does not wait for it,
    so the tenant stages' part loads while the session pass runs (the encoder releases the GIL:
    the second core does it). Best effort: a failure here is met again, and reported, where the
    operators are made.

    The cyclic collector makes no pass meanwhile, in any thread (its thresholds are the
    process's): the loads allocate about a million objects that live as long as the process, and
    each pass walked the young ones with every thread stopped: the sharding's and the read-ahead's
    too (decision 0049). All of it is frozen at the end, as before, with the few cycles the other
    threads dropped meanwhile (41,000 objects collected in a whole 2,500-session nightly)."""
    import gc
    import logging

    thresholds = gc.get_threshold()
    gc.set_threshold(0, *thresholds[1:])  # not gc.disable(): spaCy's model read (srsly) enables it again
    try:
        from memlib.compose.recipe import get_recipe
        from memlib.compose.reference import prepare_tenant_steps
        from memlib.compose.sessions import prepare
        from memlib.compose.vectors import TurnEncoder
        from memlib.io.lance_tables import import_lancedb
        from pipelines.staged_build import embed_threads

        encoder = TurnEncoder(ctx.cfg, threads=embed_threads(ctx.cfg))
        encoder.encode(["warm-up"], ["a first run sizes the model's buffers"])
        prepare(ctx.cfg, get_recipe(ctx.recipe))
        from memlib.graph import tenant  # noqa: F401 - graph-tool's import

        # numba's pooling loops only if tenants are pooled whole: a run whose tenants keep their
        # sessions pools what it added in numpy (run_inline loads them for a tenant built whole)
        prepare_tenant_steps(ctx.cfg, ctx.recipe, kernels=not ctx.reuses_tenants)
        import_lancedb()
        # what was loaded lives as long as the process: the collector's full passes, which stop
        # every thread, need not walk it again (about a million objects: spaCy, pydantic, lancedb)
        gc.freeze()
    except Exception as exc:  # noqa: BLE001 - see the docstring
        logging.getLogger("memlib.build").debug("prewarm: %s", exc)
    finally:
        gc.set_threshold(*thresholds)


def run_inline(shards: list[TenantShard], ctx: BuildContext, plan: Any, *, stats: dict[str, Any] | None = None,
               on_block: Callable[[dict[str, Any]], None] | None = None) -> Iterator[dict[str, Any]]:
    """:func:`pipelines.staged_build.run_staged` in this process: the same rows through the same
    operators, blocks first; yields one summary per tenant as it finishes."""
    from memlib.compose import pool_kernels
    from pipelines.operators import FEW_BLOCK_OPERATORS
    from pipelines.staged_build import resources, session_rows, session_stats

    if not shards:
        return
    cpus = ctx.cpus or os.cpu_count() or 1
    res = resources(ctx.cfg, cpus, len(plan.blocks), len(shards), sum(s.turns for s in shards), len(shards))
    res = replace(res, embed_workers=max(1, int(cpus)))  # the only embed actor: texts on every core
    # the tenant operator (its modules, the published build it starts from) is made on a thread
    # while the blocks go through the session operators here; the tenant rows start meanwhile, on
    # every core (:func:`tenant_workers`), each reading its published build and kept sessions
    # until it waits for this run's blocks, as a tenant actor does on Ray. Each tenant is built
    # alone, so a row's output does not depend on which thread built it or when; the summaries
    # are yielded in the rows' order
    workers = ThreadPoolExecutor(tenant_workers(cpus, len(shards)), "memlib-tenant",
                                 initializer=_one_kernel_thread_here)
    finished, tenant_ops = False, []
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="memlib-tenant-op") as making:
            tenant_ops = [making.submit(_make, op, ctx, res) for op in FEW_BLOCK_OPERATORS
                          if op.kind is RowKind.TENANT]
            if built_whole(shards, plan, ctx.cfg.embed.dim):
                making.submit(pool_kernels.warm)  # its pooling takes numba's loops: loaded meanwhile
            block_ops = [_make(op, ctx, res) for op in FEW_BLOCK_OPERATORS if op.kind is not RowKind.TENANT]
            items = session_rows(ctx, plan, shards)
            start = time.time()
            built = [workers.submit(_through_made, tenant_ops, item) for item in items
                     if item["kind"] == RowKind.TENANT.value]
            blocks: list[dict[str, Any]] = []
            for item in items:  # a tenant row waits for its blocks' index files
                if item["kind"] == RowKind.TENANT.value:
                    continue
                row = _through(block_ops, item)
                _blocks_kept(tenant_ops)
                summary = json.loads(row["summary"])
                blocks.append(summary)
                if on_block is not None:
                    on_block(summary)
        for done in built:
            yield from json.loads(done.result()["summary"])
        finished = True
    finally:
        if not finished:  # a tenant waiting for a block never kept would wait for ray.tenant_wait_s
            _blocks_kept(tenant_ops, stop=True)
        workers.shutdown(wait=True, cancel_futures=True)
    shutil.rmtree(ctx.work_dir, ignore_errors=True)
    if stats is not None:
        kept = max([b.get("kept_at", start) for b in blocks] or [start])
        stats.update(session_stats(plan, blocks, kept - start), key=ctx.session_key, inline=True)


def built_whole(shards: list[TenantShard], plan: Any, dim: int) -> bool:
    """Whether a big tenant of the run keeps no session of an earlier run (``plan``: the session
    plan): its steps pool every token row of it, what numba's loops are for; the others pool only
    what their added sessions changed (:func:`memlib.compose.pool_kernels.pools_big`)."""
    from memlib.compose.pool_kernels import pools_big

    return any(not plan.tenant_kept.get(s.tenant_id) and pools_big(s.turns, dim) for s in shards)


def tenant_workers(cpus: float, rows: int) -> int:
    """How many tenant rows a run in the driver builds at once: one per core, as many tenant actors
    would share a node's cores on Ray (LME8's nightly: 8 rows, 3.7 -> 2.7 s on 2 cores)."""
    return max(1, min(int(cpus), rows))


@contextmanager
def one_kernel_thread() -> Iterator[None]:
    """graph-tool's OpenMP pool at one thread while the tenant stages run here, as in a tenant actor
    (Ray gives an actor of less than one CPU ``OMP_NUM_THREADS=1``): the same PageRank kernel as
    on Ray, and no pool spin-waiting for a second core (a shared box's load multiplied the
    tenants' PageRank time)."""
    from memlib.graph.ppr import openmp_threads

    before = openmp_threads()
    openmp_threads(1)
    try:
        yield
    finally:
        openmp_threads(before)


def _one_kernel_thread_here() -> None:
    """graph-tool's OpenMP pool at one thread for the calling thread (a tenant worker's: an OpenMP
    thread count set on one thread does not reach the others)."""
    from memlib.graph.ppr import openmp_threads

    openmp_threads(1)


def _through_made(ops: list[Future], item: dict[str, Any]) -> dict[str, Any]:
    """``item`` through the operators made on another thread, once they are."""
    return _through([made.result() for made in ops], item)


def _blocks_kept(ops: list[Future], stop: bool = False) -> None:
    """Wake the tenant rows waiting for blocks (a block was just kept, or with ``stop`` none will
    be: they fail instead of waiting)."""
    for made in ops:
        if made.done() and made.exception() is None and hasattr(made.result(), "blocks_kept"):
            made.result().blocks_kept(stop)


def _make(op: type, ctx: BuildContext, res: Any) -> Callable[[pa.Table], pa.Table]:
    """The operator as a callable of one batch: its function with its arguments, or an instance."""
    args = op.arguments(ctx, res)
    udf = op.udf()
    if op.pool is None:
        return lambda batch: udf(batch, **args)
    return udf(**args)


def _through(ops: list[Callable[[pa.Table], pa.Table]], item: dict[str, Any]) -> dict[str, Any]:
    batch = pa.Table.from_pylist([{**item, "turns": None, "vectors": None, "summary": None}], schema=ROW_SCHEMA)
    for op in ops:
        batch = op(batch)
    return rows(batch)[0]
