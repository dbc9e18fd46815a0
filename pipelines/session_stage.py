"""The staged build on Ray Data: session blocks -> embed operator -> session-local stages ->
kept session outputs; then the tenant-level stages of every touched tenant.

Operators (each declares the columns it reads and writes; a row is one block of whole
sessions of one or more tenants, its tables carried as Arrow IPC bytes so no operator ever
sees half a session):

====================  ==============================  ================================  =====================
operator              reads                           writes                            runs on
====================  ==============================  ================================  =====================
``turn_nodes``        block_path                      block_id, turns (+ text, key)     tasks
``embed``             turns                           vectors (TURN_VECTORS)            actor pool: ray.embed_*
``session_local``     turns, vectors                  block_id, summary (outputs kept)  actor pool (spaCy)
``tenant``            tenant shard                    summary (staged tables written)   actor pool
====================  ==============================  ================================  =====================

The embed operator is the only place a model is loaded; its actors take ``ray.embed_cpus``
CPUs and ``ray.embed_gpus`` GPUs each (config), and batch the turn texts of many sessions
and tenants. Session outputs are kept in :class:`memlib.build.session_store.SessionStore`
keyed by session content hash and build key: a session already kept is never recomputed.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray

from memlib import schema
from memlib.build.recipe import get_recipe
from memlib.build.session_store import SessionStore, block_id
from memlib.build.sessions import session_keys, sort_turns
from memlib.config import MemlibConfig
from pipelines.shard import TenantShard

# column contracts of the operators (checked by tests/pipeline/test_pipeline_stages.py)
TURN_NODES_IN = ("block_path",)
TURN_NODES_OUT = ("block_id", "turns")
EMBED_IN = ("block_id", "turns")
EMBED_OUT = ("block_id", "turns", "vectors")
SESSION_LOCAL_IN = ("block_id", "turns", "vectors")
SESSION_LOCAL_OUT = ("block_id", "summary")
TEXT_COLUMN = "_text"
KEY_COLUMN = "session_key"
SESSION_ACTOR_CPUS = 0.25
TURN_NODES_CPUS = 0.05
# how the embed pass runs the encoder (memlib.build.vectors.one_by_one); part of the session
# build key, so outputs kept by an earlier way of encoding are never reused
EMBED_PASS = "one-by-one"
# the build's actors share the node's cores with each other: the libraries that would start a
# thread pool per process (polars, HF tokenizers / rayon) run on the actor's own thread
WORKER_ENV = {"POLARS_MAX_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
RUNTIME_ENV = {"env_vars": WORKER_ENV}


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def failure_reason(exc: BaseException) -> str:
    """One line: the exception and the innermost frame of memlib code that raised it."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/memlib/" in f.filename
              or "/pipelines/" in f.filename]
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {str(exc)[:300]}{where}".replace("\n", " ")


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


# ---- operators -------------------------------------------------------------------------------

def turn_nodes_op(batch: dict[str, np.ndarray], cfg: MemlibConfig) -> dict[str, list[Any]]:
    """Read a block file; add each turn's node text (what the encoder sees)."""
    from memlib.build.sessions import turn_texts

    out: dict[str, list[Any]] = {"block_id": [], "turns": []}
    for path in batch["block_path"]:
        turns = pq.read_table(str(path))
        turns = turns.append_column(TEXT_COLUMN, turn_texts(turns, cfg))
        out["block_id"].append(Path(str(path)).stem)
        out["turns"].append(to_ipc(turns))
    return out


class EmbedOp:
    """The embed operator: loads the model once per actor, encodes every turn text of a block."""

    def __init__(self, cfg: MemlibConfig, threads: int | None):
        from memlib.build.vectors import TurnEncoder

        self.cfg = cfg
        self.encoder = TurnEncoder(cfg, threads=threads)
        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"block_id": [], "turns": [], "vectors": []}
        for bid, data in zip(batch["block_id"], batch["turns"]):
            turns = from_ipc(data)
            start, cpu = time.perf_counter(), time.process_time()
            tv = self.encoder.encode(turns.column("node_id").to_pylist(), turns.column(TEXT_COLUMN).to_pylist())
            table = tv.table(turns.column(KEY_COLUMN).to_pylist(), turns.column("tenant_id").to_pylist(),
                             self.encoder.dim)
            meta = {"embed_s": round(time.perf_counter() - start, 4),
                    "embed_cpu_s": round(time.process_time() - cpu, 4), "embed_pid": os.getpid(),
                    "embed_gpus": self.gpu_ids}
            table = table.replace_schema_metadata({"memlib": json.dumps(meta)})
            out["block_id"].append(_scalar(bid))
            out["turns"].append(_scalar(data))
            out["vectors"].append(to_ipc(table))
        return out


class SessionLocalOp:
    """Session-local stages of every session of a block; writes the block's kept outputs."""

    def __init__(self, cfg: MemlibConfig, recipe: str, store: str, build_key: str):
        self.cfg = cfg
        self.plan = get_recipe(recipe)
        self.store = SessionStore(store, build_key, cfg.embed.dim)
        self.nlp = None  # spaCy, loaded by the first session that needs it, then kept

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"block_id": [], "summary": []}
        for bid, turns_ipc, vec_ipc in zip(batch["block_id"], batch["turns"], batch["vectors"]):
            out["block_id"].append(_scalar(bid))
            out["summary"].append(json.dumps(self.run_block(str(bid), from_ipc(turns_ipc), from_ipc(vec_ipc))))
        return out

    def run_block(self, bid: str, turns: pa.Table, vectors: pa.Table) -> dict[str, Any]:
        from memlib.build.sessions import SessionOutput, session_local, split_sessions
        from memlib.build.vectors import TurnVectors

        start, cpu = time.perf_counter(), time.process_time()
        meta = json.loads((vectors.schema.metadata or {}).get(b"memlib", b"{}"))
        tv = TurnVectors.from_table(vectors)
        row = {n: i for i, n in enumerate(tv.node_ids)}
        parts = []
        for session in split_sessions(turns.drop_columns([TEXT_COLUMN])):
            key = session.column(KEY_COLUMN)[0].as_py()
            vec = tv.vectors[[row[n] for n in session.column("node_id").to_pylist()]]
            part, self.nlp = session_local(session.drop_columns([KEY_COLUMN]), vec, key, self.cfg, self.plan, self.nlp)
            parts.append(part)
        index = (pa.table({"key": turns.column(KEY_COLUMN), "tenant": turns.column("tenant_id")})
                 .group_by(["key", "tenant"], use_threads=False).aggregate([([], "count_all")]))
        index = pa.table({"session_key": index.column("key"), "tenant_id": index.column("tenant"),
                          "turns": pc.cast(index.column("count_all"), pa.int32())})
        self.store.write_block(bid, SessionOutput.concat(parts), vectors.replace_schema_metadata(None), index)
        return {"block_id": bid, "sessions": index.num_rows, "turns": turns.num_rows,
                "session_local_s": round(time.perf_counter() - start, 4),
                "session_local_cpu_s": round(time.process_time() - cpu, 4), **meta}


class TenantOp:
    """Tenant-level stages of one tenant from its kept session outputs; writes its staged tables."""

    def __init__(self, cfg: MemlibConfig, recipe: str, store: str, build_key: str, llm_limiter: Any = None):
        self.cfg = cfg
        self.recipe = recipe
        self.store_dir = store
        self.sessions = SessionStore(store, build_key, cfg.embed.dim)
        self.build_key = build_key
        self.nlp = None
        self.extras: dict[str, Any] | None = None
        self.llm_limiter = llm_limiter
        self._encoder_tag: str | None = None

    def _extras(self) -> dict[str, Any]:
        if self.extras is None:
            from pipelines.llm_stage import llm_extras, llm_stages

            uses_llm = bool(llm_stages(self.cfg, self.recipe))
            self.extras = llm_extras(self.cfg, self.store_dir, self.llm_limiter) if uses_llm else {}
        return self.extras

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        rows: dict[str, list[Any]] = {"tenant_id": [], "summary": []}
        for i in range(len(batch["tenant_id"])):
            shard = TenantShard(**{k: _scalar(batch[k][i]) for k in TenantShard.__dataclass_fields__})
            rows["tenant_id"].append(shard.tenant_id)
            try:
                summary = self.build_one(shard)
            except Exception as exc:  # one tenant's failure is reported, never another tenant's
                summary = {"tenant_id": shard.tenant_id, "error": failure_reason(exc)}
            rows["summary"].append(json.dumps(summary))
        return rows

    def build_one(self, shard: TenantShard) -> dict[str, Any]:
        from memlib.build.compose import tenant_stage
        from pipelines.llm_stage import call_summary, drain_llm_calls
        from pipelines.store_sink import write_llm_calls
        from pipelines.tenant_stage import write_parquet

        start, cpu = time.perf_counter(), time.process_time()
        turns = sort_turns(pq.read_table(shard.turns_path))
        keys = session_keys(turns, self.build_key)
        order = list(dict.fromkeys(keys.to_pylist()))
        self.sessions._index = None  # blocks written since this actor started
        parts, vectors = self.sessions.read(order)
        read_s = time.perf_counter() - start
        extras = self._extras()
        out = tenant_stage(turns, parts, vectors, self.cfg, order, self.recipe, nlp=self.nlp, extras=extras)
        nodes = out.nodes
        if shard.graph_path:
            nodes = self._graph(shard, out)
        write_parquet(nodes, shard.nodes_path, schema.nodes_schema(nodes.schema.field("embedding").type.list_size),
                      "nodes")
        write_parquet(out.edges, shard.edges_path, schema.EDGES, "edges")
        write_parquet(out.segments, shard.segments_path, schema.SEGMENTS, "segments")
        if out.token_matrix is not None:
            t0 = time.perf_counter()
            self._store_matrix(shard, turns, out)
            out.timings["token_matrix"] = round(time.perf_counter() - t0, 3)
        calls = drain_llm_calls(extras)
        write_llm_calls(shard, calls)
        llm = call_summary(calls)
        out.timings["read_sessions"] = round(read_s, 3)
        return {"tenant_id": shard.tenant_id, "turns": turns.num_rows, "sessions": len(order),
                "timings": out.timings, "seconds": round(time.perf_counter() - start, 3),
                "cpu_s": round(time.process_time() - cpu, 3), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id(), **out.counts(),
                **({"llm": llm} if llm else {})}

    def _graph(self, shard: TenantShard, out: Any) -> pa.Table:
        """The tenant's graph-tool graph (.gt) and global importance, joined into its nodes."""
        from memlib.graph.tenant import build_tenant_graph
        from pipelines.store_sink import with_importance

        t0 = time.perf_counter()
        cols = [c for c in out.nodes.column_names if c != "embedding"]
        importance = build_tenant_graph(out.nodes.select(cols), out.edges, self.cfg.graph, shard.graph_path)
        out.timings["graph"] = round(time.perf_counter() - t0, 3)
        return schema.conform(with_importance(out.nodes, importance), out.nodes.schema, name="nodes")

    def _store_matrix(self, shard: TenantShard, turns: pa.Table, out: Any) -> None:
        from memlib.build.vectors import auto_encoder_model
        from memlib.io.store import LATE_CACHE_SUBDIR
        from memlib.retrieve import late

        node_text = dict(zip(out.nodes.column("node_id").to_pylist(), out.nodes.column("text").to_pylist()))
        texts = [node_text[t] for t in out.token_matrix.turn_ids]
        if self._encoder_tag is None:  # the derived model's digest: hashed once per actor
            self._encoder_tag = late.model_file(auto_encoder_model(self.cfg), self.cfg.embed.model_cache)[1]
        tag = self._encoder_tag
        late.store_matrix(shard.tenant_id, texts, out.token_matrix, tag, Path(self.store_dir) / LATE_CACHE_SUBDIR)


# ---- driver ----------------------------------------------------------------------------------

@dataclass
class SessionPlan:
    """What the session pass must compute: the block files of pending sessions."""
    blocks: list[str]
    sessions: int          # sessions of the tenants to build
    pending: int           # of which not kept yet
    pending_turns: int


def plan_sessions(shards: list[TenantShard], store: SessionStore, build_key: str, work_dir: Path,
                  block_turns: int, reuse: bool = True) -> SessionPlan:
    """Pack the pending sessions of ``shards`` into block files of at most ``block_turns`` turns
    (whole sessions, many tenants per block); a tenant's turns are read one tenant at a time."""
    work_dir.mkdir(parents=True, exist_ok=True)
    blocks: list[str] = []
    buf: list[pa.Table] = []
    buf_turns = 0
    total = pending = pending_turns = 0

    def flush() -> None:
        nonlocal buf, buf_turns
        if not buf:
            return
        table = pa.concat_tables(buf)
        path = work_dir / f"{block_id(table.column(KEY_COLUMN).to_pylist())}.parquet"
        pq.write_table(table, path)
        blocks.append(str(path))
        buf, buf_turns = [], 0

    for shard in sorted(shards, key=lambda s: s.tenant_id):
        turns = sort_turns(pq.read_table(shard.turns_path))
        keys = session_keys(turns, build_key)
        turns = turns.append_column(KEY_COLUMN, keys)
        distinct = list(dict.fromkeys(keys.to_pylist()))
        total += len(distinct)
        kept = store.known(distinct) if reuse else set()
        todo = [k for k in distinct if k not in kept]
        if not todo:
            continue
        todo_turns = turns.filter(pc.is_in(turns.column(KEY_COLUMN), value_set=pa.array(todo, pa.string())))
        pending += len(todo)
        pending_turns += todo_turns.num_rows
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
    flush()
    return SessionPlan(blocks=blocks, sessions=total, pending=pending, pending_turns=pending_turns)


@dataclass(frozen=True)
class Resources:
    embed_actors: int
    embed_cpus: float
    embed_gpus: float
    embed_threads: int | None
    session_actors: int


def resources(cfg: MemlibConfig, total_cpus: float, n_blocks: int) -> Resources:
    """Actor counts and per-actor resources of the session pass, from config and the cluster size.

    Default: one embed actor per ``ray.embed_cpus`` of the cluster, each running the encoder on
    that many threads (one thread per actor is the most work per core: onnxruntime gains less
    than 2x from a second thread), and one session-local (spaCy) actor per CPU. Both pools are
    fixed-size and their reservations fit the cluster together, so neither waits for the other
    to give up CPU: with the session-local pool sized by Ray Data's autoscaler from one actor,
    the embed actors held the CPUs and a single spaCy actor became the pass's bottleneck (seen:
    one busy core once the embedding was done, 34 blocks queued before it)."""
    r = cfg.ray
    session_actors = max(1, min(int(total_cpus), max(1, n_blocks)))
    free = max(SESSION_ACTOR_CPUS, total_cpus - session_actors * SESSION_ACTOR_CPUS - TURN_NODES_CPUS)
    actors = r.embed_actors or max(1, int(round(total_cpus / r.embed_cpus)))
    actors = max(1, min(actors, max(1, n_blocks)))
    cpus = round(min(r.embed_cpus, free / actors), 3)
    threads = cfg.embed.threads or max(1, int(r.embed_cpus))
    return Resources(actors, cpus, r.embed_gpus, threads, session_actors)


def run_sessions(plan: SessionPlan, cfg: MemlibConfig, recipe: str, store: str, build_key: str,
                 total_cpus: float) -> Iterator[dict[str, Any]]:
    """Run the session pass over ``plan.blocks``; yield one summary per block as it is kept."""
    if not plan.blocks:
        return
    res = resources(cfg, total_cpus, len(plan.blocks))
    ds = ray.data.from_items([{"block_path": p} for p in plan.blocks], override_num_blocks=len(plan.blocks))
    ds = ds.map_batches(turn_nodes_op, batch_size=1, num_cpus=TURN_NODES_CPUS, fn_kwargs={"cfg": cfg})
    gpus = {"num_gpus": res.embed_gpus} if res.embed_gpus else {}
    ds = ds.map_batches(EmbedOp, batch_size=1, num_cpus=res.embed_cpus, **gpus, runtime_env=RUNTIME_ENV,
                        compute=ray.data.ActorPoolStrategy(size=res.embed_actors),
                        fn_constructor_kwargs={"cfg": cfg, "threads": res.embed_threads})
    ds = ds.map_batches(SessionLocalOp, batch_size=1, num_cpus=SESSION_ACTOR_CPUS, runtime_env=RUNTIME_ENV,
                        compute=ray.data.ActorPoolStrategy(size=res.session_actors),
                        fn_constructor_kwargs={"cfg": cfg, "recipe": recipe, "store": store, "build_key": build_key})
    for row in ds.iter_rows():
        yield json.loads(row["summary"])


def run_tenant_stage(shards: list[TenantShard], cfg: MemlibConfig, recipe: str, store: str, build_key: str,
                     *, workers: int, total_cpus: float) -> Iterator[dict[str, Any]]:
    """Tenant-level stages of ``shards``, largest tenant first, one tenant in flight per actor."""
    if not shards:
        return
    from pipelines.llm_stage import llm_stages, shared_limiter

    workers = max(1, min(workers, len(shards)))
    limiter = shared_limiter(cfg) if llm_stages(cfg, recipe) else None
    ds = ray.data.from_items([s.row() for s in sorted(shards, key=lambda s: -s.turns)], override_num_blocks=len(shards))
    pool = ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1)
    ds = ds.map_batches(TenantOp, batch_size=1, compute=pool, num_cpus=max(0.25, total_cpus / workers / 2),
                        runtime_env=RUNTIME_ENV,
                        fn_constructor_kwargs={"cfg": cfg, "recipe": recipe, "store": store, "build_key": build_key,
                                               "llm_limiter": limiter})
    for row in ds.iter_rows():
        yield json.loads(row["summary"])


def session_build_key(cfg: MemlibConfig, key: str) -> str:
    """The key session outputs are kept under: the build key plus what decides the embed pass's
    token vectors (``auto``'s encoder, whether token matrices are kept)."""
    import hashlib

    from memlib.build.vectors import auto_encoder_model

    extra = f"{auto_encoder_model(cfg)}|{cfg.retrieve.precompute_token_matrices}|{EMBED_PASS}"
    return f"{key}-{hashlib.sha256(extra.encode()).hexdigest()[:8]}"


def run_staged(shards: list[TenantShard], cfg: MemlibConfig, recipe: str, *, store: str | Path, build_key: str,
               workers: int, total_cpus: float, reuse: bool = True,
               stats: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """The staged build of ``shards``: session pass over the pending sessions, then the tenant
    stages. Yields one summary per tenant; ``stats`` receives the session pass's figures."""
    if not shards:
        return
    store = str(store)
    key = session_build_key(cfg, build_key)
    sessions = SessionStore(store, key, cfg.embed.dim)
    work = Path(shards[0].turns_path).parent.parent / "_work" / "blocks"
    start = time.perf_counter()
    plan = plan_sessions(shards, sessions, key, work, cfg.ray.block_turns, reuse)
    blocks = list(run_sessions(plan, cfg, recipe, store, key, total_cpus))
    stats = stats if stats is not None else {}
    stats.update(sessions=plan.sessions, sessions_computed=plan.pending, turns_computed=plan.pending_turns,
                 blocks=len(plan.blocks), session_pass_s=round(time.perf_counter() - start, 3),
                 embed_s=round(sum(b.get("embed_s", 0.0) for b in blocks), 3),
                 session_local_s=round(sum(b.get("session_local_s", 0.0) for b in blocks), 3),
                 embed_cpu_s=round(sum(b.get("embed_cpu_s", 0.0) for b in blocks), 3),
                 session_local_cpu_s=round(sum(b.get("session_local_cpu_s", 0.0) for b in blocks), 3),
                 embed_actors=len({b.get("embed_pid") for b in blocks}),
                 embed_gpus=sorted({g for b in blocks for g in b.get("embed_gpus", [])}))
    shutil.rmtree(work.parent, ignore_errors=True)  # the pending-block files (<version>/_work)
    stats["key"] = key
    yield from run_tenant_stage(shards, cfg, recipe, store, key, workers=workers, total_cpus=total_cpus)
