"""One tenant, end to end: build the graph, compute global importance, and its ``.gt`` bytes."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from memlib.config import GraphConfig
from memlib.graph.build import build_graph, set_importance, to_bytes
from memlib.graph.importance import global_importance


def build_tenant_graph(nodes: pa.Table, edges: pa.Table, cfg: GraphConfig) -> tuple[pa.Table, bytes]:
    """Build and score one tenant's graph; return its importance table (node_id, importance,
    pagerank, degree, kcore) for the ``nodes.importance`` column, and the graph as ``.gt`` bytes."""
    graph = build_graph(nodes, edges, cfg)
    table = global_importance(graph, cfg)
    set_importance(graph, table.column("importance").to_numpy().astype(np.float64))
    return table, to_bytes(graph)
