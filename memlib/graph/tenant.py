"""One tenant, end to end: build the graph, compute global importance, save the ``.gt``."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from memlib.config import GraphConfig
from memlib.graph.build import build_graph, save, set_importance
from memlib.graph.importance import global_importance


def build_tenant_graph(nodes: pa.Table, edges: pa.Table, cfg: GraphConfig, path: str | Path) -> pa.Table:
    """Build, score and save one tenant's graph at ``path``; return its importance table
    (node_id, importance, pagerank, degree, kcore) for the ``nodes.importance`` column."""
    graph = build_graph(nodes, edges, cfg)
    table = global_importance(graph, cfg)
    set_importance(graph, table.column("importance").to_numpy().astype(np.float64))
    save(graph, path)
    return table
