from __future__ import annotations

import numpy as np
import pyarrow as pa

from jobs.cli import inspect_store
from memlib.graph.build import build_graph, save
from memlib.io.store import StoreWriter


def test_inspect_store_prints_kinds_hubs_importance(tmp_path, small_tables, capsys):
    nodes, edges = small_tables
    n = nodes.num_rows
    nodes = (nodes.drop_columns(["importance"])
             .append_column("importance", pa.array(np.linspace(0.1, 0.9, n), pa.float32()))
             .append_column("text", pa.array([f"text of {i}" for i in nodes.column("node_id").to_pylist()]))
             .append_column("embedding", pa.array([[0.5] * 8] * n, pa.list_(pa.float32(), 8))))
    w = StoreWriter(tmp_path / "store", dim=8)
    w.write_table("edges", "t", edges)
    w.replace_tenant_nodes(["t"], nodes)
    save(build_graph(nodes, edges), w.graph_path("t"))
    w.publish({"tenants": {"t": {"nodes": n}}})

    out = inspect_store.run(tmp_path / "store")
    printed = capsys.readouterr().out
    s = out[0]
    assert s["nodes"] == n and s["edges"] == edges.num_rows
    assert s["nodes_by_kind"]["turn"] == 6 and s["edges_by_kind"]["HAS_CONCEPT"] == 6
    assert s["hubs"][0]["node_id"] == "concept:hub" and s["hubs"][0]["degree"] == 8
    assert s["top_importance"][0]["node_id"] == nodes.column("node_id")[n - 1].as_py()
    assert s["graph_file"].endswith("t.gt")
    assert "concept:hub" in printed and "HAS_CONCEPT 6" in printed
