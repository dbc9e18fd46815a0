from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from memlib.config import GraphConfig
from memlib.graph.build import GraphBuildError, build_graph, load, save
from memlib.graph.synthetic import synthetic_memory_graph, to_tables


def test_build_properties(small_tables):
    nodes, edges = small_tables
    g = build_graph(nodes, edges, GraphConfig())
    assert g.num_nodes == nodes.num_rows and g.num_edges == edges.num_rows
    assert g.gt.num_vertices() == g.num_nodes and g.gt.num_edges() == g.num_edges
    assert g.kind_names().tolist() == nodes.column("kind").to_pylist()
    got = sorted(zip(g.ids[g.src].tolist(), g.ids[g.dst].tolist(), g.edge_kind_names().tolist()))
    want = sorted(zip(*(edges.column(c).to_pylist() for c in ("src", "dst", "kind"))))
    assert got == want
    assert (np.diff(g.src) >= 0).all()
    assert g.degree[g.vertex("concept:hub")] == 8
    assert g.degree[g.vertex("clue:lonely")] == 0
    assert g.time[0] == 1_700_000_000_000_000
    rel = g.relation[g.edge_kind_names() == "RELATION"]
    assert [g.relations[r] for r in rel] == ["likes"]


def test_missing_endpoint_names_edge(small_tables):
    nodes, edges = small_tables
    bad = pa.concat_tables([edges, pa.table({
        "tenant_id": ["t"], "src": ["turn:0"], "dst": ["fact:ghost"], "kind": ["DERIVED_FROM"],
        "weight": pa.array([1.0], pa.float32()), "relation": pa.array([None], pa.string())})])
    with pytest.raises(GraphBuildError, match="fact:ghost"):
        build_graph(nodes, bad)


def test_duplicate_node_ids_rejected(small_tables):
    nodes, edges = small_tables
    with pytest.raises(GraphBuildError, match="duplicate"):
        build_graph(pa.concat_tables([nodes, nodes.slice(0, 1)]), edges)


def test_save_load_round_trip(small_tables, tmp_path):
    nodes, edges = small_tables
    g = build_graph(nodes, edges)
    g.importance = np.linspace(0, 1, g.num_nodes)
    g.gt.vp["importance"].a = g.importance
    h = load(save(g, tmp_path / "t.gt"))
    assert h.ids.tolist() == g.ids.tolist()
    assert h.kind_names().tolist() == g.kind_names().tolist()
    assert h.edge_kind_names().tolist() == g.edge_kind_names().tolist()
    np.testing.assert_array_equal(h.src, g.src)
    np.testing.assert_array_equal(h.dst, g.dst)
    np.testing.assert_allclose(h.weight, g.weight)
    np.testing.assert_allclose(h.importance, g.importance)
    np.testing.assert_array_equal(h.time, g.time)
    assert h.relations == g.relations and h.vertex("entity:b") == g.vertex("entity:b")
    assert not (tmp_path / "t.gt.tmp").exists()


def test_tables_round_trip_synthetic(tmp_path):
    syn = synthetic_memory_graph(400, seed=3)
    nodes, edges = to_tables(syn)
    g = load(save(build_graph(nodes, edges), tmp_path / "s.gt"))
    assert g.num_nodes == syn.num_nodes and g.num_edges == syn.num_edges
    np.testing.assert_array_equal(g.degree, syn.degree)
