"""Lance index upkeep of a nightly run: rows added since the last indexing are searchable at
once (exact scan of unindexed rows), and are merged into the indexes only past a threshold."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from memlib import schema
from memlib.io.store import StoreWriter

DIM = 8


def _nodes(tenant: str, texts: list[str]) -> pa.Table:
    rng = np.random.default_rng(len(tenant))
    rows = [dict(node_id=f"{tenant}-{i}", tenant_id=tenant, conversation_id=tenant, kind="turn", text=t,
                 session_id="s1", provenance=[f"{tenant}-{i}"], embedding=rng.random(DIM).tolist())
            for i, t in enumerate(texts)]
    return schema.conform(pa.Table.from_pylist(rows), schema.nodes_schema(DIM), name="nodes")


def _fts(writer: StoreWriter, word: str, tenant: str) -> list[str]:
    res = (writer.open_turn_text().search(word, query_type="fts").where(f"tenant_id = '{tenant}'", prefilter=True)
           .limit(5).to_arrow())
    return res.column("node_id").to_pylist()


def _index_ids(writer: StoreWriter) -> dict[str, str]:
    return {f"{name}/{i.name}": str(i.index_uuid) for name, t in writer.lance_tables().items()
            for i in t.list_indices()}


def test_nightly_rows_are_searchable_before_the_indexes_take_them_in(tmp_path):
    writer = StoreWriter(tmp_path / "store", dim=DIM)
    writer.replace_tenant_nodes(["a"], _nodes("a", [f"apple pie number {i}" for i in range(50)]))
    writer.index_nodes()
    assert writer.unindexed_rows() == 0
    indexes = _index_ids(writer)

    writer.replace_tenant_nodes(["b"], _nodes("b", ["a zebra crossing", "zebra stripes", "plain words"]))
    writer.index_nodes(incremental=True, merge_rows=10)
    assert writer.unindexed_rows() == 3  # nothing rewritten: the run's cost follows what changed
    assert _index_ids(writer) == indexes
    assert sorted(_fts(writer, "zebra", "b")) == ["b-0", "b-1"]  # found by the exact scan

    writer.replace_tenant_nodes(["c"], _nodes("c", [f"zebra herd {i}" for i in range(20)]))
    writer.index_nodes(incremental=True, merge_rows=10)  # 23 unindexed rows > 10: merged
    assert writer.unindexed_rows() == 0 and _index_ids(writer) != indexes
    assert sorted(_fts(writer, "zebra", "b")) == ["b-0", "b-1"]
    assert len(_fts(writer, "zebra", "c")) == 5


def test_vector_index_only_when_asked(tmp_path):
    """Per-tenant searches scan exactly, so no IVF index by default; ``vector_index`` builds it."""
    texts = [f"word {i}" for i in range(40)]
    plain = StoreWriter(tmp_path / "plain", dim=DIM)
    plain.replace_tenant_nodes(["a"], _nodes("a", texts))
    plain.index_nodes(min_rows_for_ann=10)
    assert "embedding" not in {c for i in plain.open_nodes().list_indices() for c in i.columns}
    ann = StoreWriter(tmp_path / "ann", dim=DIM)
    ann.replace_tenant_nodes(["a"], _nodes("a", texts))
    ann.index_nodes(min_rows_for_ann=10, vector_index=True)
    assert "embedding" in {c for i in ann.open_nodes().list_indices() for c in i.columns}
