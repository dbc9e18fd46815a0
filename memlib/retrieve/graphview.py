"""A tenant's graph aligned with its :class:`TenantIndex` rows, loaded once per index.

Graph strategies work on vertex arrays: ``rows[v]`` is the index row of vertex ``v`` (-1
when the node has no row), ``sims(qvec)`` the cosine of the query with every vertex
(0 without an embedding), ``kinds`` the kind name of every vertex."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from memlib.config import GraphConfig
from memlib.graph.model import MemoryGraph
from memlib.graph.variants import gaama_ppr_scores

_LOCK = threading.Lock()


class GraphView:
    def __init__(self, index, graph: MemoryGraph, cfg: GraphConfig | None = None):
        self.index = index
        self.graph = graph
        self.cfg = cfg or GraphConfig()
        self.rows = np.fromiter((index.row_of.get(n, -1) for n in graph.ids.tolist()), dtype=np.int64,
                                count=graph.num_nodes)
        self.kinds = graph.kind_names()
        self.is_turn = np.fromiter((n in index.turns for n in graph.ids.tolist()), dtype=bool, count=graph.num_nodes)
        emb = index.embeddings
        self.vectors = np.where((self.rows >= 0)[:, None], emb[np.maximum(self.rows, 0)] if emb.size else 0.0, 0.0)
        self.vectors = self.vectors.astype(np.float32)

    def sims(self, qvec: np.ndarray) -> np.ndarray:
        q = np.asarray(qvec, dtype=np.float32)
        return self.vectors @ (q / max(float(np.linalg.norm(q)), 1e-12))

    def gaama_ppr(self, seeds: Mapping[str, float], graph: MemoryGraph | None = None) -> np.ndarray:
        return gaama_ppr_scores(graph if graph is not None else self.graph, seeds, self.cfg)

    def neighbours(self, v: int) -> tuple[np.ndarray, np.ndarray]:
        """(neighbour vertices, edge kind codes) of ``v``, both directions."""
        adj = self.graph.adjacency()
        sl = slice(adj.indptr[v], adj.indptr[v + 1])
        return adj.nbr[sl], self.graph.edge_kind[adj.eid[sl]]

    def edge_kind_codes(self, table: Mapping[str, float], default: float) -> np.ndarray:
        """Value per edge-kind code."""
        return np.array([float(table.get(k, default)) for k in self.graph.edge_kinds] or [default])


def graph_view(index, cfg: GraphConfig | None = None) -> GraphView | None:
    """The tenant's :class:`GraphView`, or None when the tenant has no graph file."""
    def build() -> GraphView | None:
        return GraphView(index, index.graph, cfg) if index.has_graph else None

    return index.memo("graph_view", build)


_QCACHE: "OrderedDict[tuple[int, str], np.ndarray]" = OrderedDict()
QCACHE_SIZE = 4096


def query_vector(index, query: str) -> np.ndarray:
    """``index.embed_query(query)`` through a small process-wide LRU shared by the graph
    strategies (an evaluation runs several strategies over the same questions)."""
    key = (id(index.embedder), query)
    with _LOCK:
        hit = _QCACHE.get(key)
        if hit is not None:
            _QCACHE.move_to_end(key)
            return hit
    vec = index.embed_query(query)
    with _LOCK:
        _QCACHE[key] = vec
        while len(_QCACHE) > QCACHE_SIZE:
            _QCACHE.popitem(last=False)
    return vec
