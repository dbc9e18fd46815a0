from __future__ import annotations

import pytest

from memlib.graph.build import load
from memlib.graph.synthetic import synthetic_memory_graph, to_tables
from pipelines.graph_tasks import build_graphs


@pytest.mark.ray
def test_build_graphs_three_tenants(ray_local, tmp_path, small_tables):
    items = [("alpha", *small_tables)]
    for i, tenant in enumerate(["beta", "gamma"]):
        nodes, edges = to_tables(synthetic_memory_graph(200 + 100 * i, seed=i), tenant)
        items.append((tenant, ray_local.put(nodes), ray_local.put(edges)))
    out = build_graphs(items, tmp_path / "graphs")
    assert sorted(out) == ["alpha", "beta", "gamma"]
    assert sorted(p.name for p in (tmp_path / "graphs").glob("*.gt")) == ["alpha.gt", "beta.gt", "gamma.gt"]
    for tenant, table in out.items():
        g = load(tmp_path / "graphs" / f"{tenant}.gt")
        assert table.num_rows == g.num_nodes
        assert table.column("node_id").to_pylist() == g.ids.tolist()
        assert (g.importance == table.column("importance").to_numpy()).all()
