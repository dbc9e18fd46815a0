from __future__ import annotations

import numpy as np
import pytest

from memlib.config import GraphConfig
from memlib.graph.build import build_graph
from memlib.graph.subgraph import subgraph
from memlib.graph.synthetic import synthetic_memory_graph
from memlib.graph.variants import gaama_ppr_scores


def _bfs(g, seeds, depth):
    nbrs = {i: set() for i in range(g.num_nodes)}
    for s, d in zip(g.src.tolist(), g.dst.tolist()):
        nbrs[s].add(d)
        nbrs[d].add(s)
    seen = set(seeds)
    frontier = set(seeds)
    for _ in range(depth):
        frontier = {n for f in frontier for n in nbrs[f]} - seen
        seen |= frontier
    return seen


def test_depth_one_and_two(small_tables):
    g = build_graph(*small_tables)
    s1 = subgraph(g, ["turn:0"], 1)
    assert set(s1.ids.tolist()) == {"turn:0", "turn:1", "concept:hub"}
    s2 = subgraph(g, ["turn:0"], 2)
    expect = {g.ids[i] for i in _bfs(g, [g.vertex("turn:0")], 2)}
    assert set(s2.ids.tolist()) == expect
    assert "entity:b" not in expect and "fact:1" in expect


def test_induced_edges_and_kinds(small_tables):
    g = build_graph(*small_tables)
    sub = subgraph(g, ["entity:a", "turn:3"], 1)
    members = set(sub.ids.tolist())
    expected = sorted((g.ids[s], g.ids[d], g.edge_kinds[k]) for s, d, k in zip(g.src, g.dst, g.edge_kind)
                      if g.ids[s] in members and g.ids[d] in members)
    got = sorted((sub.ids[s], sub.ids[d], sub.edge_kinds[k]) for s, d, k in zip(sub.src, sub.dst, sub.edge_kind))
    assert got == expected
    assert ("turn:3", "turn:3", "SIMILAR") in got  # self-loop kept once
    assert sub.degree[sub.vertex("concept:hub")] == 8  # parent degree kept
    assert sub.vertex("turn:3") >= 0 and sub.vertices(["fact:1"])[0] == -1


def test_max_nodes_cap_and_determinism():
    g = synthetic_memory_graph(20_000, seed=2)
    seeds = g.ids[np.flatnonzero(g.kind_mask("turn"))[:10]].tolist()
    a = subgraph(g, seeds, 2, max_nodes=500)
    b = subgraph(g, seeds, 2, max_nodes=500)
    assert a.num_nodes == 500
    assert a.ids.tolist() == b.ids.tolist()
    assert set(seeds) <= set(a.ids.tolist())
    full = _bfs(g, g.vertices(seeds).tolist(), 2)
    assert set(a.parent_index.tolist()) <= full


def test_subgraph_ppr_matches_ppr_of_materialized_subgraph(small_tables):
    """PPR on a cut subgraph equals PPR on a graph built from the same induced tables."""
    import pyarrow as pa
    import pyarrow.compute as pc

    nodes, edges = small_tables
    g = build_graph(nodes, edges)
    sub = subgraph(g, ["turn:2"], 1)
    keep = pa.array(sub.ids.tolist())
    n2 = nodes.filter(pc.is_in(nodes["node_id"], keep))
    e2 = edges.filter(pc.and_(pc.is_in(edges["src"], keep), pc.is_in(edges["dst"], keep)))
    h = build_graph(n2, e2)
    h.degree = g.degree[g.vertices(h.ids.tolist())]  # same hub degrees as the parent
    cfg = GraphConfig(hub_degree=3, tol=1e-12, max_iter=5000)
    a = gaama_ppr_scores(sub, {"turn:2": 1.0}, cfg)
    b = gaama_ppr_scores(h, {"turn:2": 1.0}, cfg)
    np.testing.assert_allclose(a, b[h.vertices(sub.ids.tolist())], atol=1e-10)


def test_empty_and_invalid(small_tables):
    g = build_graph(*small_tables)
    assert subgraph(g, ["missing"], 2).num_nodes == 0
    with pytest.raises(ValueError):
        subgraph(g, ["turn:0"], 1, max_nodes=0)
