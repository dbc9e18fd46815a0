"""Lance index upkeep of a nightly run: rows added since the last indexing are searchable at
once (exact scan of unindexed rows), and are merged into the indexes only past a threshold."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

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


def _unindexed(writer: StoreWriter) -> dict[str, int]:
    return {f"{name}/{i.name}": int(i.num_unindexed_rows or 0) for name, t in writer.lance_tables().items()
            for i in t.list_indices()}


def test_nightly_rows_are_searchable_before_the_indexes_take_them_in(tmp_path):
    writer = StoreWriter(tmp_path / "store", dim=DIM)
    writer.replace_tenant_nodes(["a"], _nodes("a", [f"apple pie number {i}" for i in range(50)]))
    writer.index_nodes()
    assert writer.unindexed_rows() == 0
    indexes = _index_ids(writer)

    writer.replace_tenant_nodes(["b"], _nodes("b", ["a zebra crossing", "zebra stripes", "plain words"]))
    writer.index_nodes(incremental=True, merge_rows=10)
    # the full-text indexes are not rewritten (the run's cost follows what changed); the bitmap
    # indexes a tenant's rows are read through are rebuilt, and cover every row
    assert writer.unindexed_rows() == 3
    assert _unindexed(writer) == {"lance_version/text_idx": 3, "lance_version/tenant_id_idx": 0,
                                  "lance_version/kind_idx": 0, "lance_turn_text_version/text_idx": 3,
                                  "lance_turn_text_version/tenant_id_idx": 0}
    now = _index_ids(writer)
    assert {k: v for k, v in now.items() if "text_idx" in k} == {k: v for k, v in indexes.items() if "text_idx" in k}
    assert now["lance_version/tenant_id_idx"] != indexes["lance_version/tenant_id_idx"]
    assert sorted(_fts(writer, "zebra", "b")) == ["b-0", "b-1"]  # found by the exact scan
    assert sorted(writer.open_nodes().search().where("tenant_id = 'b'").limit(None).to_arrow()
                  .column("node_id").to_pylist()) == ["b-0", "b-1", "b-2"]

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


def _versions(writer: StoreWriter) -> dict[str, int]:
    return {name: len(t.list_versions()) for name, t in writer.lance_tables().items()}


def _tenant_texts(writer: StoreWriter, version: int | None = None) -> dict[str, list[str]]:
    tbl = writer.open_nodes()
    if version is not None:
        tbl.checkout(version)
    rows = tbl.search().select(["tenant_id", "text"]).limit(None).to_arrow().to_pylist()
    out: dict[str, list[str]] = {}
    for r in sorted(rows, key=lambda r: (r["tenant_id"], r["text"])):
        out.setdefault(r["tenant_id"], []).append(r["text"])
    return out


def test_many_tenants_are_written_in_commits_that_follow_rows(tmp_path):
    """300 tenants replaced and 3 removed in one call: one delete commit and one add commit per
    ``rows_per_commit`` rows in each Lance table, never commits per tenant; every tenant's rows
    are there once, the removed ones' are gone, the others' are untouched."""
    writer = StoreWriter(tmp_path / "store", dim=DIM)
    tenants = [f"t{i:03d}" for i in range(300)]
    before = _versions(writer)
    writer.write_tenants([], (_nodes(t, [f"{t} first {i}" for i in range(4)]) for t in tenants),
                         rows_per_commit=500)
    after = _versions(writer)
    # 1,200 rows in batches of >= 500 rows: 3 add commits per table (no delete: nothing to remove)
    assert {k: after[k] - before[k] for k in after} == {"lance_version": 3, "lance_turn_text_version": 3}
    assert writer.fragment_counts() == {"nodes": 3, "turn_text": 3}
    touched = tenants[::30]  # 10 tenants rebuilt, 3 removed
    removed = ["t001", "t002", "t003"]
    writer.write_tenants(touched + removed, (_nodes(t, [f"{t} second"]) for t in touched), rows_per_commit=500)
    again = _versions(writer)
    assert {k: again[k] - after[k] for k in after} == {"lance_version": 2, "lance_turn_text_version": 2}
    texts = _tenant_texts(writer)
    assert set(texts) == set(tenants) - set(removed)
    assert all(texts[t] == [f"{t} second"] for t in touched)
    assert texts["t004"] == [f"t004 first {i}" for i in range(4)]
    assert writer.open_turn_text().count_rows() == writer.open_nodes().count_rows() == 4 * 287 + 10


@pytest.mark.heavy
def test_fragments_stay_bounded_and_old_versions_readable_after_many_runs(tmp_path):
    """Each run adds a fragment; a run that finds more than ``max_fragments`` compacts both tables,
    keeping every older version: the first published version still reads as it was."""
    writer = StoreWriter(tmp_path / "store", dim=DIM)
    writer.write_tenants([], [_nodes(f"t{i}", [f"t{i} row {j}" for j in range(3)]) for i in range(20)])
    writer.index_nodes()
    first = writer.open_nodes().version
    first_texts = _tenant_texts(writer)
    for run in range(12):  # a nightly run each: one tenant rebuilt
        t = f"t{run}"
        writer.write_tenants([t], [_nodes(t, [f"{t} run {run}"])])
        writer.index_nodes(incremental=True, merge_rows=1_000, max_fragments=4)
        assert max(writer.fragment_counts().values()) <= 5, (run, writer.fragment_counts())
    assert _tenant_texts(writer, first) == first_texts  # rollback to the first version still works
    now = _tenant_texts(writer)
    assert now["t11"] == ["t11 run 11"] and now["t15"] == [f"t15 row {j}" for j in range(3)]
    assert sorted(_fts(writer, "run", "t3")) == ["t3-0"]
