"""Per-tenant build on Ray Data: ``memlib.build.process_tenant`` in an actor pool.

Each input row is one tenant (a :class:`~pipelines.shard.TenantShard`): the actor reads the
tenant's turns file, runs the recipe (all of a tenant's sessions together) and writes the
tenant's nodes (staged, with embeddings), edges and segments into the store version
directory. Only a small summary row per tenant travels back to the driver, which streams
them with ``iter_rows`` (never ``take_all``). The embedder and spaCy are built once per actor.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from memlib import schema
from memlib.build import process_tenant
from memlib.config import MemlibConfig
from pipelines.shard import TenantShard


def write_parquet(table: pa.Table, path: str, table_schema: pa.Schema, name: str) -> None:
    """Conform and write atomically (temp file + rename)."""
    table = schema.conform(table, table_schema, name=name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


class TenantBuildActor:
    """Builds the embedder once; then one tenant per call."""

    def __init__(self, cfg: MemlibConfig, recipe: str, llm_limiter: Any = None):
        from memlib.embed import get_embedder

        self.cfg = cfg
        self.recipe = recipe
        self.embedder = get_embedder(cfg.embed)
        self.nlp = None  # spaCy is loaded by the first extraction stage, then kept
        self.extras: dict[str, Any] | None = None  # LLM client (cache + shared limiter), built once
        self.llm_limiter = llm_limiter  # the driver's limiter actor proxy (outlives every pool worker)

    def _extras(self, shard: TenantShard) -> dict[str, Any]:
        if self.extras is None:
            from pipelines.llm_stage import llm_extras, llm_stages
            from pipelines.store_sink import store_dir_of

            uses_llm = bool(llm_stages(self.cfg, self.recipe))
            self.extras = llm_extras(self.cfg, store_dir_of(shard), self.llm_limiter) if uses_llm else {}
        return self.extras

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        rows: dict[str, list[Any]] = {"tenant_id": [], "summary": []}
        for i in range(len(batch["tenant_id"])):
            shard = TenantShard(**{k: _scalar(batch[k][i]) for k in TenantShard.__dataclass_fields__})
            rows["tenant_id"].append(shard.tenant_id)
            rows["summary"].append(json.dumps(self.build_one(shard)))
        return rows

    def build_one(self, shard: TenantShard) -> dict[str, Any]:
        start = time.perf_counter()
        turns = pq.read_table(shard.turns_path)
        from pipelines.llm_stage import call_summary, drain_llm_calls
        from pipelines.store_sink import write_llm_calls

        extras = self._extras(shard)
        out = process_tenant(turns, self.cfg, self.embedder, nlp=self.nlp, recipe=self.recipe, extras=extras)
        write_parquet(out.nodes, shard.nodes_path, schema.nodes_schema(self.embedder.dim), "nodes")
        write_parquet(out.edges, shard.edges_path, schema.EDGES, "edges")
        write_parquet(out.segments, shard.segments_path, schema.SEGMENTS, "segments")
        if self.cfg.retrieve.precompute_token_matrices and turns.num_rows:
            out.timings["token_matrix"] = self._precompute(shard, turns, out.nodes)
        calls = drain_llm_calls(extras)
        write_llm_calls(shard, calls)
        llm = call_summary(calls)
        return {"tenant_id": shard.tenant_id, "turns": turns.num_rows, "timings": out.timings,
                "seconds": round(time.perf_counter() - start, 3), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id(), **out.counts(),
                **({"llm": llm} if llm else {})}

    def _precompute(self, shard: TenantShard, turns: pa.Table, nodes: pa.Table) -> float:
        """auto's token matrix of the tenant, written to the store's cache; seconds spent."""
        from memlib.io.store import LATE_CACHE_SUBDIR
        from memlib.retrieve import late
        from memlib.retrieve.registry import strategy_params
        from pipelines.store_sink import store_dir_of

        start = time.perf_counter()
        encoder = late.get_encoder(1, strategy_params("auto", self.cfg).get("encoder", late.DEFAULT_MODEL),
                                   self.cfg.embed.model_cache)
        late.precompute(shard.tenant_id, turns, nodes, encoder, store_dir_of(shard) / LATE_CACHE_SUBDIR)
        return round(time.perf_counter() - start, 3)


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def actor_config(cfg: MemlibConfig, total_cpus: int, workers: int) -> MemlibConfig:
    """The config each actor uses: embedder threads split between the actors on this node."""
    if cfg.embed.threads is not None:
        return cfg
    out = cfg.model_copy(deep=True)
    out.embed.threads = max(1, total_cpus // max(1, workers))
    return out


def run_tenants(shards: list[TenantShard], cfg: MemlibConfig, recipe: str, *, workers: int,
                total_cpus: int) -> Iterator[dict[str, Any]]:
    """Yield one summary per tenant as its build finishes (streaming)."""
    if not shards:
        return
    workers = max(1, min(workers, len(shards)))
    from pipelines.llm_stage import llm_stages, shared_limiter

    # created (and owned) by the driver: an actor created inside a pool worker dies with it
    limiter = shared_limiter(cfg) if llm_stages(cfg, recipe) else None
    ds = ray.data.from_items([s.row() for s in sorted(shards, key=lambda s: -s.turns)],
                             override_num_blocks=len(shards))
    # One tenant in flight per actor: with Ray's default queue of several blocks per actor a
    # small tenant can wait behind the largest one while another actor sits idle (measured on
    # locomo_dev3: 663+369 turns queued on one actor, 419 on the other). Largest-first with
    # one at a time is LPT scheduling.
    pool = ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1)
    ds = ds.map_batches(TenantBuildActor, batch_size=1, compute=pool,
                        num_cpus=max(0.25, total_cpus / workers / 2),
                        fn_constructor_kwargs={"cfg": actor_config(cfg, total_cpus, workers), "recipe": recipe,
                                               "llm_limiter": limiter})
    for row in ds.iter_rows():
        yield json.loads(row["summary"])
