"""One tenant, end to end: build the graph, compute global importance, and its ``.gt`` bytes."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from memlib.config import GraphConfig
from memlib.graph.build import build_graph, set_importance, to_bytes
from memlib.graph.importance import global_importance
from memlib.graph.model import MemoryGraph


def build_tenant_graph(nodes: pa.Table, edges: pa.Table, cfg: GraphConfig) -> tuple[pa.Table, bytes, MemoryGraph]:
    """Build and score one tenant's graph; return its importance table (node_id, importance,
    pagerank, degree, kcore) for the ``nodes.importance`` column, the graph as ``.gt`` bytes, and
    the graph itself with its importance set: the arrays those bytes load back to
    (:func:`memlib.graph.build.load`), from which the memory view is made without reading them back."""
    graph = build_graph(nodes, edges, cfg)
    table = global_importance(graph, cfg)
    set_importance(graph, table.column("importance").to_numpy().astype(np.float64))
    return table, to_bytes(graph), graph
