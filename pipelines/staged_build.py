"""The staged build on Ray Data: one dataset whose rows are session blocks and tenants.

The driver packs the pending sessions of the tenants to build (new or changed ones; all of
them in a full build) into block files of whole sessions, many tenants per block, largest
tenant first, and starts one dataset: the block rows go through ``turn_nodes`` -> ``embed`` ->
``session_local`` (:mod:`pipelines.operators`), which keeps every session's outputs; the tenant
rows go through the tenant operator (:mod:`pipelines.tenant_op`), each starting as soon as
its own blocks are kept, while other blocks are still being worked on. The actors of all four
operators start together, so their start-up (model, spaCy, imports) overlaps, and a tenant
stage overlaps the session work of the next tenants. Summaries stream back to the driver: one
per block, one per tenant.
"""
from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib.compose.session_store import SessionStore, block_id
from memlib.compose.sessions import session_keys, sort_turns
from memlib.config import MemlibConfig
from memlib.io.files import replace_parquet
from pipelines.context import BuildContext
from pipelines.operators import FEW_BLOCK_OPERATORS, OPERATORS, RUNTIME_ENV, SessionLocalOp, TenantOp, block_item
from pipelines.rows import BATCH_FORMAT, KEY_COLUMN, ROW_SCHEMA, Operator, RowKind
from pipelines.shard import TenantShard, read_staged, tenant_runs
from pipelines.tenant_op import pack_tenants, tenant_item

if TYPE_CHECKING:  # Ray is imported where a build runs on it: an inline run never does
    import ray

log = logging.getLogger("memlib.build")


@dataclass
class SessionPlan:
    """What the session operators must compute: the block files of pending sessions."""
    blocks: list[str]
    sessions: int          # sessions of the tenants to build
    pending: int           # of which not kept yet
    pending_turns: int
    tenant_blocks: dict[str, list[str]] = field(default_factory=dict)  # tenant -> ids of blocks it waits for
    tenant_pending: dict[str, list[str]] = field(default_factory=dict)  # tenant -> its session keys in those blocks
    tenant_kept: dict[str, list[str]] = field(default_factory=dict)  # tenant -> blocks of its sessions kept before
    tenant_sessions: dict[str, list[str]] = field(default_factory=dict)  # tenant -> all its session keys, in order
    damaged: dict[str, str] = field(default_factory=dict)  # kept block -> why it was dropped (see trusted_blocks)


def plan_sessions(shards: list[TenantShard], store: SessionStore, build_key: str, work_dir: Path,
                  block_turns: int, reuse: bool = True) -> SessionPlan:
    """Pack the pending sessions of ``shards`` into block files of at most ``block_turns`` turns
    (whole sessions, many tenants per block, the largest tenant's first so its tenant stage can
    start earliest); the turns are read one staged file (a batch of tenants) at a time."""
    work_dir.mkdir(parents=True, exist_ok=True)
    plan = SessionPlan(blocks=[], sessions=0, pending=0, pending_turns=0)
    # the kept sessions' index (a file per kept block) is read while the first file's session keys
    # are computed: its Parquet reads wait on the GIL little, the keys' hashing holds it
    ahead = _read_ahead(store.index) if reuse else None
    buf: list[pa.Table] = []
    buf_turns = 0
    waiting: set[str] = set()  # tenants with sessions in the current buffer

    def flush() -> None:
        nonlocal buf, buf_turns
        if not buf:
            return
        table = pa.concat_tables(buf)
        bid = block_id(table.column(KEY_COLUMN).to_pylist())
        path = work_dir / f"{bid}.parquet"
        replace_parquet(table, path)
        plan.blocks.append(str(path))
        for tenant in waiting:
            plan.tenant_blocks.setdefault(tenant, []).append(bid)
        buf, buf_turns = [], 0
        waiting.clear()

    by_file: dict[str, list[TenantShard]] = {}
    for shard in shards:
        by_file.setdefault(shard.turns_path, []).append(shard)
    for path in sorted(by_file, key=lambda p: (-max(s.turns for s in by_file[p]), p)):
        tenants = sorted(by_file[path], key=lambda s: (-s.turns, s.tenant_id))
        # the file's rows of these tenants (a tenant merged from a later input file has its rows
        # in that file's batch), their session keys computed once for the whole batch
        table = _in_session_order(_of_tenants(read_staged(path), [s.tenant_id for s in tenants]))
        keys = session_keys(table, build_key)
        table = table.append_column(KEY_COLUMN, keys)
        if ahead is not None:
            ahead.join()  # a failure there is raised by trusted_blocks' own reading
            ahead = None
        kept = trusted_blocks(store, dict.fromkeys(keys.to_pylist()), shards, plan.damaged) if reuse else {}
        runs = tenant_runs(table)
        for shard in tenants:
            plan.tenant_blocks.setdefault(shard.tenant_id, [])
            turns = table.slice(*runs[shard.tenant_id])
            distinct = list(dict.fromkeys(turns.column(KEY_COLUMN).to_pylist()))
            plan.sessions += len(distinct)
            plan.tenant_sessions[shard.tenant_id] = distinct
            todo = [k for k in distinct if k not in kept]
            plan.tenant_pending[shard.tenant_id] = todo
            plan.tenant_kept[shard.tenant_id] = sorted({kept[k] for k in distinct if k in kept})
            if not todo:
                continue
            todo_turns = turns.filter(pc.is_in(turns.column(KEY_COLUMN), value_set=pa.array(todo, pa.string())))
            plan.pending += len(todo)
            plan.pending_turns += todo_turns.num_rows
            # sessions are contiguous in ``todo_turns`` (sorted): cut between sessions only
            k = todo_turns.column(KEY_COLUMN).to_numpy(zero_copy_only=False)
            starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
            ends = np.r_[starts[1:], len(k)]
            for a, b in zip(starts, ends):
                n = int(b - a)
                if buf_turns and buf_turns + n > block_turns:
                    flush()
                buf.append(todo_turns.slice(int(a), n))
                buf_turns += n
                waiting.add(shard.tenant_id)
    flush()
    return plan


def _of_tenants(table: pa.Table, tenants: list[str]) -> pa.Table:
    """The rows of ``tenants``: ``table`` itself when they are all of them (no copy of its columns)."""
    mask = pc.is_in(table.column("tenant_id"), value_set=pa.array(tenants, pa.string()))
    return table if pc.all(mask).as_py() else table.filter(mask)


def _in_session_order(turns: pa.Table) -> pa.Table:
    """``sort_turns(turns)``; ``turns`` itself when in that order already (the reader writes a
    tenant's turns session after session): a sort's take copied every column, its texts too."""
    order = pc.sort_indices(turns, sort_keys=SESSION_ORDER)
    if pc.all(pc.equal(order, pa.array(np.arange(len(order), dtype=np.uint64)))).as_py():
        return turns
    return sort_turns(turns)


def _read_ahead(read: Callable[[], Any]) -> threading.Thread:
    """``read()`` started on a thread of its own (its error ignored: whoever needs what it reads
    reads it again and meets the error then)."""
    def run() -> None:
        try:
            read()
        except Exception:  # noqa: BLE001 - see above
            log.debug("reading ahead failed", exc_info=True)

    thread = threading.Thread(target=run, name="memlib-index-ahead", daemon=True)
    thread.start()
    return thread


def kept_reads(plan: SessionPlan, tenants: list[str]) -> list[tuple[list[str], list[str]]]:
    """What the rows of ``tenants`` read first (:meth:`pipelines.tenant_op.TenantOp.read_sessions`):
    per tenant with sessions kept by earlier runs, their keys in session order and their blocks."""
    out = []
    for tenant in tenants:
        pending = set(plan.tenant_pending.get(tenant, []))
        keys = [k for k in plan.tenant_sessions.get(tenant, []) if k not in pending]
        if keys and tenant in plan.tenant_kept:
            out.append((keys, plan.tenant_kept[tenant]))
    return out


def trusted_blocks(store: SessionStore, keys: list[str], building: list[TenantShard],
                   damaged: dict[str, str]) -> dict[str, str]:
    """Kept session key -> its block, for those of ``keys`` kept in blocks whose files have the
    checksums written with them. A damaged block (or one whose index file cannot be read) is
    logged and dropped, so its sessions are computed again, here and by every later run: a bad
    entry is never kept. Other tenants with sessions in it are named (they are served
    unavailable until rebuilt: ``memlib verify`` says how); ``damaged`` receives block -> why."""
    while True:
        kept = store.blocks_holding(keys)
        bad = store.verify(set(kept.values()))
        bad.update({b: f"index file unreadable: {why}" for b, why in store.unreadable.items()})
        if not bad:
            store.record_mtimes(set(kept.values()))
            return kept
        idx = store.index()
        mine = {s.tenant_id for s in building}
        for b, why in sorted(bad.items()):
            held = idx.filter(pc.equal(idx.column("block"), b)).column("tenant_id").to_pylist()
            others = sorted(set(held) - mine)
            damaged[b] = why + (f"; it also held sessions of {', '.join(others[:5])}, not rebuilt by this run"
                                if others else "")
            log.warning("kept session block %s is damaged (%s): dropped, its sessions are computed again", b, why)
        store.drop(list(bad))


SESSION_ORDER = [("tenant_id", "ascending"), ("conversation_id", "ascending"),  # sort_turns' order
                 ("session_index", "ascending"), ("turn_index", "ascending")]
FEW_BLOCKS_PER_ACTOR = 4  # Ray Data's default tasks in flight per actor


@dataclass(frozen=True)
class Resources:
    embed_actors: int
    embed_cpus: float
    embed_gpus: float
    embed_threads: int | None
    session_actors: int
    tenant_actors: int
    embed_workers: int = 1  # texts an embed actor encodes at once (the driver's cores inline, pipelines/inline.py)


def resources(cfg: MemlibConfig, total_cpus: float, n_blocks: int, n_tenants: int = 1,
              tenant_turns: int | None = None, tenant_rows: int | None = None) -> Resources:
    """Actor counts and per-actor resources of the build's operators, from config and the cluster.

    Default: one embed actor per ``ray.embed_cpus`` of the cluster, each running the encoder on
    that many threads (one thread per actor is the most work per core: onnxruntime gains less
    than 2x from a second thread), one session-local (spaCy) actor per CPU (at most one per
    block) and one tenant actor per CPU (at most one per tenant and one per
    ``ray.tenant_actor_turns`` of the ``tenant_turns`` to build: a nightly run touching three
    50-session tenants took 19.6 s in the tenant phase with one tenant actor against 22.0 with
    two, mean of three alternated runs, docs/decisions/0012-tenant-actor-sizing.md).
    The pools are fixed-size and their reservations fit the cluster together, so no operator
    waits for another to give up CPU (an autoscaled session-local pool stayed at one actor
    behind the embed actors' reservations: one busy core once the embedding was done). The
    reservations are what Ray places by; the operating system shares the cores among the busy
    actors of the moment.

    A tenant also costs a fixed share of an actor's time whatever its size (reading, its steps'
    set-up, its files: about 0.15 s for a 5-turn tenant), so many small tenants get an actor per
    ``ray.tenant_actor_tenants`` of them; never more actors than ``tenant_rows`` (small tenants
    travel together: :func:`pipelines.tenant_op.pack_tenants`)."""
    r = cfg.ray
    session_actors = max(1, min(int(total_cpus), max(1, n_blocks)))
    by_work = -(-tenant_turns // r.tenant_actor_turns) if tenant_turns is not None else n_tenants
    by_work = max(by_work, -(-n_tenants // r.tenant_actor_tenants))
    rows = n_tenants if tenant_rows is None else tenant_rows
    tenant_actors = max(1, min(int(total_cpus), rows, by_work))
    taken = session_actors * SessionLocalOp.num_cpus + tenant_actors * TenantOp.num_cpus
    free = max(SessionLocalOp.num_cpus, total_cpus - taken)
    actors = r.embed_actors or max(1, int(round(total_cpus / r.embed_cpus)))
    actors = max(1, min(actors, max(1, n_blocks)))
    cpus = round(min(r.embed_cpus, free / actors), 3)
    return Resources(actors, cpus, r.embed_gpus, embed_threads(cfg), session_actors, tenant_actors)


def embed_threads(cfg: MemlibConfig) -> int:
    """The encoder's threads in each embed actor (and in the driver, pipelines/inline.py)."""
    return cfg.embed.threads or max(1, int(cfg.ray.embed_cpus))


def build_dataset(ctx: BuildContext, plan: SessionPlan, shards: list[TenantShard]) -> ray.data.Dataset:
    """The build's one dataset: tenant rows (largest first), then block rows, through the operators
    of :data:`pipelines.operators.OPERATORS` in turn, each as its class declares.
    When ``ctx.worker_env_inherited``, the workers already have :data:`~pipelines.operators.WORKER_ENV`
    (a local instance started with it), so the operators ask for no runtime environment."""
    cfg = ctx.cfg
    packed = pack_tenants(shards, cfg.ray.tenant_batch_turns)
    res = resources(cfg, ctx.cpus, len(plan.blocks), len(shards), sum(s.turns for s in shards), len(packed))
    items = session_rows(ctx, plan, shards)
    table = pa.Table.from_pylist([{**i, "turns": None, "vectors": None, "summary": None} for i in items],
                                 schema=ROW_SCHEMA)
    # one row per block; from_blocks takes each block's metadata here (from_arrow runs a task per
    # block for it, on workers that must first import ray.data: 2.1 s of a nightly run's start)
    import ray

    ds = ray.data.from_blocks([table.slice(i, 1) for i in range(table.num_rows)])
    env = {} if ctx.worker_env_inherited else {"runtime_env": RUNTIME_ENV}
    # few blocks (a nightly run): one in flight per actor, so a block goes to an idle actor, not
    # into the queue of the first actor up (Ray Data's default of 4 in flight gave that actor both
    # blocks of a 1 % nightly run at 10,000 tenants: 25 s of embedding on one core while the other
    # idled). Many blocks keep the default: an actor's next block is queued when it finishes one.
    few = len(plan.blocks) <= FEW_BLOCKS_PER_ACTOR * res.embed_actors
    for op in FEW_BLOCK_OPERATORS if few else OPERATORS:
        ds = ds.map_batches(op.udf(), batch_size=1, batch_format=BATCH_FORMAT, **env, **ray_options(op, ctx, res, few))
    return ds


def session_rows(ctx: BuildContext, plan: SessionPlan, shards: list[TenantShard]) -> list[dict[str, Any]]:
    """The dataset's rows (``kind`` and ``item``): one per tenant row, then one per block. Small
    tenants travel together: one tenant row per large tenant or per batch. Tenant rows come first:
    they pass the session operators before any block occupies them, so a tenant actor can read the
    tenant's sessions kept by earlier runs while this run's blocks are computed."""
    packed = pack_tenants(shards, ctx.cfg.ray.tenant_batch_turns)
    items = [{"kind": RowKind.TENANT.value,
              "item": json.dumps([tenant_item(s, plan.tenant_blocks.get(s.tenant_id, []), ctx.work_dir,
                                              plan.tenant_pending.get(s.tenant_id, []),
                                              plan.tenant_sessions.get(s.tenant_id),
                                              plan.tenant_kept.get(s.tenant_id)) for s in row])}
             for row in packed]
    return items + [{"kind": RowKind.BLOCK.value, "item": block_item(p)} for p in plan.blocks]


def ray_options(op: type[Operator], ctx: BuildContext, res: Resources, few_blocks: bool) -> dict[str, Any]:
    """Ray Data's options of an operator, from its declaration: its CPUs (the embed operator's share
    when it declares none, so turn_nodes, declared so, is fused into the embed actors), its GPUs,
    its actor pool and rows in flight per actor, and its arguments."""
    import ray

    out: dict[str, Any] = {"num_cpus": res.embed_cpus if op.num_cpus is None else op.num_cpus}
    if op.uses_gpus and res.embed_gpus:
        out["num_gpus"] = res.embed_gpus
    if op.pool is None:
        return {**out, "fn_kwargs": op.arguments(ctx, res)}
    flight = {"max_tasks_in_flight_per_actor": 1} if op.one_in_flight or few_blocks else {}
    return {**out, "compute": ray.data.ActorPoolStrategy(size=getattr(res, op.pool), **flight),
            "fn_constructor_kwargs": op.arguments(ctx, res)}


def session_stats(plan: SessionPlan, blocks: list[dict[str, Any]], pass_s: float) -> dict[str, Any]:
    done = [b for b in blocks if "error" not in b]
    total = lambda name: round(sum(b.get(name, 0.0) for b in done), 3)  # noqa: E731
    return {"sessions": plan.sessions, "sessions_computed": plan.pending, "turns_computed": plan.pending_turns,
            "blocks": len(plan.blocks), "blocks_failed": len(blocks) - len(done), "session_pass_s": round(pass_s, 3),
            "embed_s": total("embed_s"), "session_local_s": total("session_local_s"),
            "embed_cpu_s": total("embed_cpu_s"), "session_local_cpu_s": total("session_local_cpu_s"),
            "embed_actors": len({b.get("embed_pid") for b in done}),
            # embedding and session-local stages in one process (SessionPassOp: few blocks)
            "one_session_actor": bool(done) and all(b.get("embed_pid") == b.get("session_local_pid") for b in done),
            "embed_gpus": sorted({g for b in done for g in b.get("embed_gpus", [])})}


def prepare_staged(shards: list[TenantShard], ctx: BuildContext) -> SessionPlan:
    """What the driver does before the dataset starts (no Ray needed): the pending sessions of
    ``shards`` packed into block files. :func:`jobs.builder.driver.run_build` prepares while Ray starts."""
    store = SessionStore(ctx.store, ctx.session_key, ctx.cfg.embed.dim, trust_unchanged=True)
    return plan_sessions(shards, store, ctx.session_key, ctx.work_dir / "blocks", ctx.cfg.ray.block_turns,
                         ctx.reuse)


def run_staged(shards: list[TenantShard], ctx: BuildContext, *, stats: dict[str, Any] | None = None,
               plan: SessionPlan | None = None,
               on_block: Callable[[dict[str, Any]], None] | None = None) -> Iterator[dict[str, Any]]:
    """The staged build of ``shards``; yields one summary per tenant as it finishes (an ``error``
    key when it failed). ``stats`` receives the session operators' figures once all are done.
    ``plan``: :func:`prepare_staged` of the same shards, done already; ``on_block`` is called with
    each block's summary as it comes back (a progress display counts them)."""
    if not shards:
        return
    plan = plan or prepare_staged(shards, ctx)
    start = time.time()
    ds = build_dataset(ctx, plan, shards)
    blocks: list[dict[str, Any]] = []
    for row in ds.iter_rows():
        summary = json.loads(row["summary"])
        if row["kind"] == RowKind.BLOCK.value:
            blocks.append(summary)
            if on_block is not None:
                on_block(summary)
        else:  # a tenant row: the summary of each of its tenants
            yield from summary
    shutil.rmtree(ctx.work_dir, ignore_errors=True)  # block files and failure markers (<version>/_staged/_work)
    if stats is not None:  # session pass: from the dataset's start until the last block was kept
        kept = max([b.get("kept_at", start) for b in blocks] or [start])
        stats.update(session_stats(plan, blocks, kept - start), key=ctx.session_key)
