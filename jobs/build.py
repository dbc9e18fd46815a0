"""Entrypoint of the memory build: read -> shard by tenant -> per-tenant recipe on Ray Data ->
graph per tenant -> Lance/Parquet -> indexes -> manifest -> publish.

Local Ray by default (``ray.init(address="local")``); ``address`` or the RAY_ADDRESS
environment variable (read here, never in memlib/) targets a cluster.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import ray

from memlib.build.manifest import build_manifest
from memlib.build.recipe import DEFAULT_RECIPE, JobStage, get_recipe
from memlib.build.timing import StageTimer
from memlib.config import MemlibConfig
from memlib.io.readers import input_fingerprints
from memlib.io.remote import staged_input
from memlib.io.store import StoreWriter
from pipelines.shard import TenantShard, shard_input
from pipelines.store_sink import drop_staging, write_nodes
from pipelines.tenant_stage import run_tenants

log = logging.getLogger("memlib.build")
Progress = Callable[[str, dict[str, Any]], None]


def _quiet(event: str, info: dict[str, Any]) -> None:
    log.info("%s %s", event, info)


def init_ray(address: str | None, num_cpus: int | None) -> int:
    """Connect to (or start) Ray; returns the CPUs the build may use."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = True
    return int(num_cpus or ray.cluster_resources().get("CPU", 1))


def graph_stage_available() -> bool:
    return importlib.util.find_spec("pipelines.graph_stage") is not None


def _graph_inputs(shards: list[TenantShard]):
    """(tenant, nodes ref, edges ref) per tenant: read one tenant at a time, embeddings left out."""
    for s in shards:
        if not Path(s.nodes_path).exists():
            continue
        cols = [c for c in pq.read_schema(s.nodes_path).names if c != "embedding"]
        yield s.tenant_id, ray.put(pq.read_table(s.nodes_path, columns=cols)), ray.put(pq.read_table(s.edges_path))


def run_graphs(writer: StoreWriter, shards: list[TenantShard], cfg: MemlibConfig) -> tuple[dict, dict[str, Any]]:
    """Graph per tenant (.gt files) and importance tables via pipelines.graph_stage."""
    if not graph_stage_available():
        return {}, {"status": "skipped", "reason": "pipelines.graph_stage is not installed"}
    from pipelines.graph_stage import build_graphs

    paths = {s.tenant_id: writer.graph_path(s.tenant_id) for s in shards}
    importance = build_graphs(_graph_inputs(shards), writer.version_dir / "graphs", cfg.graph, paths=paths)
    return importance, {"status": "built", "tenants": len(importance)}


def run_build(cfg: MemlibConfig, input_path: str | Path, fmt: str, out: str | Path, address: str | None = None,
              num_cpus: int | None = None, *, recipe: str = DEFAULT_RECIPE,
              progress: Progress = _quiet) -> dict[str, Any]:
    """Build a store version from ``input_path`` and publish it; returns the summary (manifest)."""
    get_recipe(recipe)  # fail early on an unknown recipe
    timer = StageTimer()
    wall = time.perf_counter()
    writer = StoreWriter(out, dim=cfg.embed.dim)
    with timer.stage(JobStage.READ), staged_input(input_path, cfg.io.staging_dir) as local_input:
        fingerprints = input_fingerprints(local_input, fmt, cfg.io)
        sharded = shard_input(local_input, fmt, cfg, writer)
    progress("read", {"tenants": len(sharded.shards), "turns": sum(s.turns for s in sharded.shards),
                      "quarantined": sharded.quarantined})
    total_cpus = init_ray(address, num_cpus)
    summaries = []
    with timer.stage(JobStage.TENANTS):
        for summary in run_tenants(sharded.shards, cfg, recipe, workers=total_cpus, total_cpus=total_cpus):
            summaries.append(summary)
            progress("tenant", summary)
    with timer.stage(JobStage.GRAPH):
        importance, graph_info = run_graphs(writer, sharded.shards, cfg)
    progress("graph", graph_info)
    with timer.stage(JobStage.WRITE):
        write_nodes(writer, sharded.shards, importance)
        drop_staging(writer, sharded.shards)
    with timer.stage(JobStage.INDEX):
        writer.index_nodes()
    timings = timer.rounded()
    timings["total"] = round(time.perf_counter() - wall, 3)
    manifest = build_manifest(cfg=cfg, recipe=recipe, input_path=str(input_path), fmt=str(fmt),
                              fingerprints=fingerprints, summaries=summaries, questions=sharded.questions,
                              quarantine_by_reason=sharded.quarantine_by_reason, timings=timings,
                              graph=graph_info)
    with timer.stage(JobStage.PUBLISH):
        published = writer.publish(manifest)
    progress("published", {"version": published["version"], "store": str(out)})
    return published
