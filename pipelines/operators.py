"""The operators of the build's one Ray Data dataset, in the order rows pass them (:data:`OPERATORS`).

Each operator class declares the kind of row it works on, the columns it reads and writes, and its
resources (:class:`pipelines.rows.Operator`); :func:`pipelines.staged_build.build_dataset`
assembles the dataset from these declarations. The block operators are here, the tenant operator
in :mod:`pipelines.tenant_op`:

==================  ======  ==========================================  ========================
operator            kind    what it does                                runs on
==================  ======  ==========================================  ========================
``turn_nodes``      block   reads the block file, adds node texts        the embed actors (fused)
``embed``           block   encodes the turns (TURN_VECTORS)             actors: ray.embed_*
``session_local``   block   session-local stages; keeps the outputs      actors (spaCy)
``tenant``          tenant  a tenant's stages, its tables                actors (pipelines.tenant_op)
==================  ======  ==========================================  ========================

``turn_nodes`` asks for the embed operator's resources, so Ray Data fuses the two and runs it
in the embed actors (a few milliseconds per block, no worker of its own to start). The embed
operator encodes the turns; the session-local actors run the same encoder on one thread for the
fact drafts' own texts (the default backend: memlib.compose.sessions.fact_vectors), and another
backend embeds facts by their own text in the tenant actor (memlib.compose.vectors.OwnPass); its actors take
``ray.embed_cpus`` CPUs and ``ray.embed_gpus`` GPUs each (config). A block that fails in an operator leaves a
failure marker (``_work/failed/BLOCK.json``) and an error summary instead of raising: the
tenants whose sessions it held are reported failed, every other tenant is built.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memlib.compose.recipe import get_recipe
from memlib.compose.session_store import SessionStore
from memlib.config import MemlibConfig
from memlib.io.files import atomic_write_json
from pipelines.context import BuildContext
from pipelines.rows import (
    BATCH_FORMAT,
    FAILED_DIR,
    KEY_COLUMN,
    ROW,
    ROW_SCHEMA,
    TEXT_COLUMN,
    Operator,
    RowKind,
    batch_of,
    failure_reason,
    from_ipc,
    on_ray,
    rows,
    to_ipc,
)
from pipelines.tenant_op import TenantOp

# the build's actors share the node's cores with each other: the libraries that would start a
# thread pool per process (polars, HF tokenizers / rayon) run on the actor's own thread
WORKER_ENV = {"POLARS_MAX_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
RUNTIME_ENV = {"env_vars": WORKER_ENV}


def block_item(path: str | Path) -> str:
    path = Path(path)
    return json.dumps({"block_id": path.stem, "path": str(path), "work": str(path.parent.parent)})


def mark_failed(item: dict[str, Any], stage: str, exc: BaseException) -> str:
    """Record that a block failed (read by the tenant operator); return its error summary."""
    reason = f"{stage}: {failure_reason(exc)}"
    marker = Path(item["work"]) / FAILED_DIR / f"{item['block_id']}.json"
    atomic_write_json(marker, {"block_id": item["block_id"], "error": reason}, durable=False, indent=None)
    return json.dumps({"block_id": item["block_id"], "error": reason})


def turn_nodes_op(batch: pa.Table, cfg: MemlibConfig) -> pa.Table:
    """Read a block file; add each turn's node text (what the encoder sees)."""
    from memlib.compose.sessions import turn_texts

    out = []
    for row in rows(batch):
        if row["kind"] == RowKind.BLOCK.value and row["turns"] is None and row["summary"] is None:
            item = json.loads(row["item"])
            try:
                turns = pq.read_table(item["path"])
                row["turns"] = to_ipc(turns.append_column(TEXT_COLUMN, turn_texts(turns, cfg)))
            except Exception as exc:  # noqa: BLE001 - the block's tenants are reported failed
                row["summary"] = mark_failed(item, "turn_nodes", exc)
        out.append(row)
    return batch_of(out)


class TurnNodesOp(Operator):
    """The turn_nodes operator: :func:`turn_nodes_op` as Ray tasks, with the embed operator's
    resources, so Ray Data fuses it into the embed actors."""
    kind = RowKind.BLOCK
    reads = ("item",)            # the block file
    writes = ("turns",)          # its turns, with each turn's node text
    uses_gpus = True

    @classmethod
    def udf(cls) -> Any:
        return turn_nodes_op

    @classmethod
    def arguments(cls, ctx: BuildContext, res: Any) -> dict[str, Any]:
        return {"cfg": ctx.cfg}


def _gpu_ids() -> list[str]:
    """The GPUs Ray gave this actor (none in the driver, :mod:`pipelines.inline`)."""
    if not on_ray():
        return []
    import ray

    return [str(g) for g in ray.get_gpu_ids()]


class EmbedOp(Operator):
    """The embed operator: loads the model once per actor, encodes every turn text of a block."""
    kind = RowKind.BLOCK
    reads = ("turns",)
    writes = ("vectors",)        # TURN_VECTORS, with the pass's figures as metadata
    uses_gpus = True
    pool = "embed_actors"

    @classmethod
    def arguments(cls, ctx: BuildContext, res: Any) -> dict[str, Any]:
        return {"ctx": ctx, "threads": res.embed_threads, "workers": res.embed_workers}

    def __init__(self, ctx: BuildContext | MemlibConfig, threads: int | None = None, workers: int = 1):
        from memlib.compose.vectors import TurnEncoder

        self.encoder = TurnEncoder(BuildContext.of(ctx).cfg, threads=threads, workers=workers)
        self.encoder.encode(["warm-up"], ["a first run sizes the model's buffers"])  # not on the first block
        self.gpu_ids = _gpu_ids()

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = []
        for row in rows(batch):
            if row["kind"] == RowKind.BLOCK.value and row["turns"] is not None:
                try:
                    row["vectors"] = self.encode(from_ipc(row["turns"]))
                except Exception as exc:  # noqa: BLE001
                    row["turns"], row["summary"] = None, mark_failed(json.loads(row["item"]), "embed", exc)
            out.append(row)
        return batch_of(out)

    def encode(self, turns: pa.Table) -> bytes:
        start, cpu = time.perf_counter(), time.process_time()
        tv = self.encoder.encode(turns.column("node_id").to_pylist(), turns.column(TEXT_COLUMN).to_pylist())
        table = tv.table(turns.column(KEY_COLUMN).to_pylist(), turns.column("tenant_id").to_pylist(),
                         self.encoder.dim)
        meta = {"embed_s": round(time.perf_counter() - start, 4), "embed_cpu_s": round(time.process_time() - cpu, 4),
                "embed_pid": os.getpid(), "embed_gpus": self.gpu_ids}
        return to_ipc(table.replace_schema_metadata({"memlib": json.dumps(meta)}))


class SessionLocalOp(Operator):
    """Session-local stages of every session of a block; writes the block's kept outputs."""
    kind = RowKind.BLOCK
    reads = ("turns", "vectors")
    writes = ("summary",)        # the block's figures; its outputs are kept on disk (SessionStore)
    num_cpus = 0.25
    pool = "session_actors"

    def __init__(self, ctx: BuildContext | MemlibConfig, *fields: str):
        """``ctx``: the run's context, or a config followed by a recipe, a store and a session key."""
        from memlib.compose.sessions import own_encoder, prepare

        ctx = BuildContext.of(ctx, *fields)
        self.cfg = cfg = ctx.cfg
        self.plan = get_recipe(ctx.recipe)
        self.store = SessionStore(ctx.store, ctx.session_key, cfg.embed.dim, trust_unchanged=True)
        self.nlp = prepare(cfg, self.plan)  # spaCy and the steps' modules, loaded while the embed pass runs
        self.own = own_encoder(cfg, self.plan)  # fact drafts' own vectors (default embedder), model loaded now
        if self.own is not None:
            self.own(["a first run sizes the model's buffers"])

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = []
        for row in rows(batch):
            if row["kind"] == RowKind.BLOCK.value and row["vectors"] is not None:
                item = json.loads(row["item"])
                try:
                    summary = self.run_block(item["block_id"], from_ipc(row["turns"]), from_ipc(row["vectors"]))
                    row["summary"] = json.dumps(summary)
                except Exception as exc:  # noqa: BLE001
                    row["summary"] = mark_failed(item, "session_local", exc)
                row["turns"] = row["vectors"] = None  # kept on disk now; nothing big travels further
            out.append(row)
        return batch_of(out)

    def run_block(self, bid: str, turns: pa.Table, vectors: pa.Table) -> dict[str, Any]:
        from memlib.compose.sessions import SessionOutput, sessions_local, split_sessions
        from memlib.compose.vectors import TurnVectors

        start, cpu = time.perf_counter(), time.process_time()
        meta = json.loads((vectors.schema.metadata or {}).get(b"memlib", b"{}"))
        tv = TurnVectors.from_table(vectors)
        position = {n: i for i, n in enumerate(tv.node_ids)}
        sessions = [(s.drop_columns([KEY_COLUMN]), tv.vectors[[position[n] for n in s.column("node_id").to_pylist()]],
                     s.column(KEY_COLUMN)[0].as_py()) for s in split_sessions(turns.drop_columns([TEXT_COLUMN]))]
        parts, self.nlp = sessions_local(sessions, self.cfg, self.plan, self.nlp, self.own)  # one spaCy call per block
        index = (pa.table({"key": turns.column(KEY_COLUMN), "tenant": turns.column("tenant_id")})
                 .group_by(["key", "tenant"], use_threads=False).aggregate([([], "count_all")]))
        index = pa.table({"session_key": index.column("key"), "tenant_id": index.column("tenant"),
                          "turns": pc.cast(index.column("count_all"), pa.int32())})
        self.store.write_block(bid, SessionOutput.concat(parts), vectors.replace_schema_metadata(None), index)
        return {"block_id": bid, "sessions": index.num_rows, "turns": turns.num_rows, "kept_at": time.time(),
                "session_local_s": round(time.perf_counter() - start, 4),
                "session_local_cpu_s": round(time.process_time() - cpu, 4), "session_local_pid": os.getpid(), **meta}


class SessionPassOp(Operator):
    """The embed and session-local operators in one actor, for a run with few blocks (a nightly
    run): one actor process to start instead of two (each imports ``ray.data`` and memlib's
    pipeline, 1.5-2 CPU-s), and with one encoder thread (the default) one model loaded instead of
    two (a process's encoders are shared by their threads and model: token_encoder.get_encoder).
    Many blocks keep them apart, so a block's spaCy work overlaps the next block's embedding. The
    outputs are the same functions of the same inputs."""
    kind = RowKind.BLOCK
    reads = ("turns",)
    writes = ("summary",)
    uses_gpus = True
    pool = "embed_actors"

    @classmethod
    def arguments(cls, ctx: BuildContext, res: Any) -> dict[str, Any]:
        return EmbedOp.arguments(ctx, res)

    def __init__(self, ctx: BuildContext | MemlibConfig, threads: int | None = None, workers: int = 1):
        self.embed = EmbedOp(ctx, threads, workers)
        self.local = SessionLocalOp(ctx)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.local(self.embed(batch))


# the operators in the order rows pass them
OPERATORS: tuple[type[Operator], ...] = (TurnNodesOp, EmbedOp, SessionLocalOp, TenantOp)
# the same with few blocks: embedding and the session-local stages in one actor
FEW_BLOCK_OPERATORS: tuple[type[Operator], ...] = (TurnNodesOp, SessionPassOp, TenantOp)
# what each reads and writes, by operator (tests/pipeline/test_pipeline_stages.py)
TURN_NODES_IO, EMBED_IO, SESSION_LOCAL_IO, TENANT_IO = (op.io() for op in OPERATORS)

__all__ = ["BATCH_FORMAT", "FEW_BLOCK_OPERATORS", "KEY_COLUMN", "OPERATORS", "ROW", "ROW_SCHEMA", "RUNTIME_ENV",
           "TEXT_COLUMN", "WORKER_ENV", "EmbedOp", "RowKind", "SessionLocalOp", "SessionPassOp", "TenantOp",
           "TurnNodesOp", "batch_of", "block_item", "from_ipc",
           "mark_failed", "rows", "to_ipc", "turn_nodes_op"]
