"""Graph stage: one Ray task per tenant builds its graph-tool graph, computes global
importance and saves ``<out_dir>/<tenant>.gt``. The importance tables come back to the
driver (small: one row per node) to fill the ``nodes.importance`` column."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray

from memlib.config import GraphConfig
from memlib.graph.tenant import build_tenant_graph


@ray.remote(num_cpus=1)
def _build_one(tenant: str, nodes: pa.Table, edges: pa.Table, cfg: GraphConfig, path: str) -> tuple[str, pa.Table]:
    return tenant, build_tenant_graph(nodes, edges, cfg, path)


def graph_file(out_dir: str | Path, tenant: str) -> Path:
    return Path(out_dir) / f"{tenant}.gt"


def build_graphs(items: Iterable[tuple[str, Any, Any]], out_dir: str | Path,
                 cfg: GraphConfig | None = None, paths: Mapping[str, str | Path] | None = None) -> dict[str, pa.Table]:
    """``items``: (tenant_id, nodes, edges) with Arrow tables or Ray object refs of them.
    Each graph goes to ``paths[tenant]`` when given (e.g. ``StoreWriter.graph_path``), else
    ``<out_dir>/<tenant>.gt``. Returns {tenant_id: importance table (node_id, importance,
    pagerank, degree, kcore)}."""
    cfg = cfg or GraphConfig()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = paths or {}
    refs = [_build_one.remote(tenant, nodes, edges, cfg, str(paths.get(tenant) or graph_file(out_dir, tenant)))
            for tenant, nodes, edges in items]
    return dict(ray.get(refs))
