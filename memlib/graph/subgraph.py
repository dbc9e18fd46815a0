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

from memlib.graph.model import Adjacency, MemoryGraph


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
    """The subgraph induced on sorted, unique ``vertices`` (local vertex order = that order).

    One pass over the members' adjacency slots keeps those whose neighbour is a member;
    they are still grouped by (local) source, so the subgraph's adjacency — and from it
    its transition matrices — come without any sort. Local edges are numbered in the order
    of their ``src``-side slots."""
    adj = graph.adjacency()
    n_parent = graph.num_nodes
    local = np.empty(n_parent, dtype=np.int64)  # only read at member positions
    inside = np.zeros(n_parent, dtype=bool)
    inside[vertices] = True
    local[vertices] = np.arange(vertices.size)
    slots = adj.slots(vertices)
    counts = np.diff(adj.indptr)[vertices]
    keep = inside[adj.nbr[slots]]
    slots = slots[keep]
    owner = np.repeat(np.arange(vertices.size, dtype=np.int64), counts)[keep]
    fwd = adj.fwd[slots]
    parent_eids = adj.eid[slots]
    edge_local = np.empty(graph.num_edges, dtype=np.int64)
    eids = parent_eids[fwd]
    edge_local[eids] = np.arange(eids.size)
    indptr = np.zeros(vertices.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=vertices.size), out=indptr[1:])
    sub_adj = Adjacency(indptr=indptr, nbr=local[adj.nbr[slots]], eid=edge_local[parent_eids], fwd=fwd)
    parent = vertices if graph.parent_index is None else graph.parent_index[vertices]
    root = graph if graph.parent is None else graph.parent
    return MemoryGraph(
        ids=graph.ids[vertices], kind=graph.kind[vertices], node_kinds=graph.node_kinds,
        time=graph.time[vertices], importance=graph.importance[vertices],
        src=owner[fwd], dst=sub_adj.nbr[fwd], edge_kind=graph.edge_kind[eids],
        edge_kinds=graph.edge_kinds, weight=graph.weight[eids], relation=graph.relation[eids],
        relations=graph.relations, degree=graph.degree[vertices], parent_index=parent, parent=root,
        _adj=sub_adj,
    )


def subgraph(graph: MemoryGraph, seed_ids: Iterable[str], depth: int, max_nodes: int = 5000) -> MemoryGraph:
    """Induced subgraph on the seeds' depth-``depth`` neighbourhood, at most ``max_nodes``
    vertices. Seed ids not in ``graph`` are ignored; an empty subgraph is returned when
    none is present."""
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    seeds = graph.vertices(seed_ids)
    return induced(graph, neighbourhood(graph, seeds, max(depth, 0), max_nodes))
