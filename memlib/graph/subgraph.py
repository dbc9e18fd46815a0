"""Query subgraphs: the seeds' depth-d neighbourhood (edges followed both ways), capped at
``max_nodes``, induced as a new :class:`MemoryGraph`. Query-time PPR then costs
O(subgraph) instead of O(tenant).

Cap policy: BFS level by level; when a level does not fit, the candidates linked to the
most already-selected vertices are taken first (ties by vertex index, so the result is
deterministic). Seeds always come first (the first ``max_nodes`` of them if there are more).
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from memlib.graph.model import MemoryGraph


def _unique_in_order(values: np.ndarray) -> np.ndarray:
    _, first = np.unique(values, return_index=True)
    return values[np.sort(first)]


def neighbourhood(graph: MemoryGraph, seeds: np.ndarray, depth: int, max_nodes: int) -> np.ndarray:
    """Sorted vertex indices of the capped depth-``depth`` neighbourhood of ``seeds``."""
    adj = graph.adjacency()
    seeds = _unique_in_order(seeds[seeds >= 0])[:max_nodes]
    visited = np.zeros(graph.num_nodes, dtype=bool)
    visited[seeds] = True
    parts, count, frontier = [seeds], seeds.size, seeds
    for _ in range(depth):
        room = max_nodes - count
        if room <= 0 or frontier.size == 0:
            break
        nb = adj.nbr[adj.slots(frontier)]
        nb = nb[~visited[nb]]
        if nb.size == 0:
            break
        cand, links = np.unique(nb, return_counts=True)
        if cand.size > room:
            cand = np.sort(cand[np.lexsort((cand, -links))[:room]])
        visited[cand] = True
        parts.append(cand)
        count += cand.size
        frontier = cand
    return np.sort(np.concatenate(parts))


def induced(graph: MemoryGraph, vertices: np.ndarray) -> MemoryGraph:
    """The subgraph induced on sorted, unique ``vertices`` (new local vertex order = that order)."""
    adj = graph.adjacency()
    inside = np.zeros(graph.num_nodes, dtype=bool)
    inside[vertices] = True
    slots = adj.slots(vertices)
    eids = np.unique(adj.eid[slots][inside[adj.nbr[slots]]])
    src = np.searchsorted(vertices, graph.src[eids])
    dst = np.searchsorted(vertices, graph.dst[eids])
    parent = vertices if graph.parent_index is None else graph.parent_index[vertices]
    return MemoryGraph(
        ids=graph.ids[vertices], kind=graph.kind[vertices], node_kinds=graph.node_kinds,
        time=graph.time[vertices], importance=graph.importance[vertices],
        src=src.astype(np.int64), dst=dst.astype(np.int64), edge_kind=graph.edge_kind[eids],
        edge_kinds=graph.edge_kinds, weight=graph.weight[eids], relation=graph.relation[eids],
        relations=graph.relations, degree=graph.degree[vertices], parent_index=parent,
    )


def subgraph(graph: MemoryGraph, seed_ids: Iterable[str], depth: int, max_nodes: int = 5000) -> MemoryGraph:
    """Induced subgraph on the seeds' depth-``depth`` neighbourhood, at most ``max_nodes``
    vertices. Seed ids not in ``graph`` are ignored; an empty subgraph is returned when
    none is present."""
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    seeds = graph.vertices(seed_ids)
    return induced(graph, neighbourhood(graph, seeds, max(depth, 0), max_nodes))
