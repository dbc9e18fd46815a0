"""Tenant views (memlib/io/views.py): the build writes each part's nodes and turns as mapped Arrow
files; a tenant opens from them with the same columns and answers with the same ranked lists as
from the Lance and Parquet tables; a missing, damaged or disagreeing view is not trusted; a store
written before views gets them when a build carries its parts over."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from memlib.io.store import StoreReader, StoreWriter
from memlib.io.views import VIEW_NODES, VIEW_TABLES, VIEW_TURNS, VIEWS, ViewError, read_batches, view_path, write_view
from memlib.retrieve.kernels import run_search
from memlib.retrieve.registry import get_strategy
from tests.retrieve.conftest import retrieve_config

QUERIES = ["kitten shelter", "When did she start the new job?", "marathon training plan"]
STRATEGIES = ["auto", "bm25", "dense", "hybrid", "gaama"]
COLUMNS = ["node_ids", "texts", "times", "session_ids", "provenance", "attributes", "turn_order"]


def _copy(store: Path, dst: Path) -> Path:
    shutil.copytree(store, dst)
    return dst


def _without_views(store: Path, dst: Path) -> Path:
    copy = _copy(store, dst)
    for name in VIEW_TABLES:
        shutil.rmtree(StoreReader(copy).version_dir / name)
    return copy


def _cache(store: Path):
    from memlib.embed import get_embedder
    from memlib.retrieve.tenant_cache import TenantCache

    return TenantCache(store, embedder=get_embedder(retrieve_config().embed))


def _answers(store: Path) -> dict:
    cache, cfg = _cache(store), retrieve_config()
    out = {}
    for name in STRATEGIES:
        strategy = get_strategy(name, cfg, disk_cache=False) if name == "auto" else get_strategy(name, cfg)
        for tenant in cache.tenants():
            for q in QUERIES:
                res = run_search(cache.get(tenant), strategy, q, 10)
                out[name, tenant, q] = [(n.node_id, round(float(n.score), 6)) for n in res.nodes]
    return out


def test_views_hold_the_tables_rows_in_their_order(sample_store):
    r = StoreReader(sample_store)
    for tenant in r.tenants():
        view, lance = r.view(VIEW_NODES, tenant), r.nodes(tenant)
        assert view.num_rows == lance.num_rows > 0
        for col in view.schema.names:
            assert view.column(col).to_pylist() == lance.column(col).to_pylist(), (tenant, col)
        turns = r.table("turns", tenant).sort_by([("session_index", "ascending"), ("turn_index", "ascending")])
        vt = r.view(VIEW_TURNS, tenant)
        assert vt.num_rows == turns.num_rows > 0
        for col in vt.schema.names:
            assert vt.column(col).to_pylist() == turns.column(col).to_pylist(), (tenant, col)


def test_the_turns_view_keeps_the_token_matrix_reference(sample_store, monkeypatch):
    """auto's token-matrix reference travels with the tenant's turns view: a cold tenant reads it
    there, not from the matrix_refs table."""
    from memlib.embed import token_encoder
    from memlib.retrieve import matrix_cache

    r = StoreReader(sample_store)
    for tenant in r.tenants():
        row = r.table("matrix_refs", tenant).to_pylist()[0]
        row.pop("tenant_id")
        assert r.view_meta(VIEW_TURNS, tenant) == {"matrix_ref": row}

    def no_table(*a, **k):
        raise AssertionError("the matrix_refs table should not be read")

    monkeypatch.setattr(matrix_cache, "_references", no_table)
    cache = _cache(sample_store)
    for tenant in cache.tenants():
        m = matrix_cache.tenant_matrix(cache.get(tenant), token_encoder.get_encoder(1), None)
        assert m.int8_from == "kept" and m.n_turns == len(cache.get(tenant).turn_order)


def test_a_tenant_opened_from_its_views_answers_as_from_the_tables(sample_store, tmp_path):
    tables = _without_views(sample_store, tmp_path / "tables")
    by_view, by_table = _cache(sample_store), _cache(tables)
    for tenant in by_view.tenants():
        a, b = by_view.get(tenant), by_table.get(tenant)
        assert a.view_used and not b.view_used
        for col in COLUMNS:
            assert getattr(a, col) == getattr(b, col), col
        assert list(a.kinds) == list(b.kinds) and np.array_equal(a.importance, b.importance)
        assert "embeddings" not in a.__dict__  # read from Lance only when a strategy needs them
        assert np.array_equal(a.embeddings, b.embeddings)
    assert _answers(sample_store) == _answers(tables)


@pytest.mark.parametrize("damage", ["torn", "short", "garbage"])
def test_a_damaged_or_disagreeing_view_is_not_trusted(sample_store, tmp_path, damage):
    """A torn nodes view, one holding a node fewer than the manifest counts for a tenant, turns
    views that are not Arrow at all: the tenants open from the tables and answer the same."""
    store = _copy(sample_store, tmp_path / "store")
    r = StoreReader(store)
    tenant = r.tenants()[1]
    nodes = view_path(r.version_dir, VIEW_NODES, r.part_of(tenant))
    if damage == "torn":
        nodes.write_bytes(nodes.read_bytes()[: nodes.stat().st_size // 2])
    elif damage == "short":
        batches = {t: pa.Table.from_batches([b]) for t, (b, _) in read_batches(nodes).items()}
        batches[tenant] = batches[tenant].slice(0, batches[tenant].num_rows - 1)
        write_view(nodes, VIEW_NODES, batches)
    else:
        view_path(r.version_dir, VIEW_TURNS, r.part_of(tenant)).write_bytes(b"not an arrow file")
    with pytest.raises(ViewError):
        r.view(VIEW_TURNS if damage == "garbage" else VIEW_NODES, tenant)
    assert not _cache(store).get(tenant).view_used or damage == "garbage"
    assert _answers(store) == _answers(sample_store)


def test_a_view_file_replaced_on_disk_is_mapped_again(tmp_path):
    f = tmp_path / "v.arrow"
    rows = lambda n: pa.table({"node_id": [str(i) for i in range(n)], "kind": ["turn"] * n,  # noqa: E731
                               "text": ["x"] * n, "time": pa.array([None] * n, pa.timestamp("us", "UTC")),
                               "session_id": ["s"] * n, "provenance": [[]] * n, "attributes": [None] * n,
                               "importance": [0.5] * n})
    write_view(f, VIEW_NODES, {"a": rows(2), "b": rows(0)})
    assert VIEWS.tenant(f, "a", 2).num_rows == 2 and VIEWS.tenant(f, "b", 0).num_rows == 0
    write_view(f, VIEW_NODES, {"a": rows(3)})
    assert VIEWS.tenant(f, "a", 3).num_rows == 3
    with pytest.raises(ViewError, match="holds no view"):
        VIEWS.tenant(f, "b", 0)
    with pytest.raises(ViewError, match="no view file"):
        VIEWS.tenant(tmp_path / "gone.arrow", "a", 1)


@pytest.mark.parametrize("keep", [3, 1])
def test_a_store_without_views_gets_them_as_its_parts_are_carried(sample_store, tmp_path, keep):
    """A store written before views: a build carrying its tenants links their part (3 of its 4
    tenants live) or rewrites it (1 of 4), and writes the views from the tables either way."""
    old = _without_views(sample_store, tmp_path / "old")
    base = StoreReader(old)
    tenants = base.tenants()[:keep]
    assert len(set(base.parts())) == 1  # the sample's four small tenants travel together
    w = StoreWriter(old, dim=base.dim)
    carried = w.carry_over(tenants, part_turns=10_000)
    assert (carried.parts[tenants[0]] == base.part_of(tenants[0])) == (keep == 3)
    manifest = dict(base.manifest, tenants={t: base.manifest["tenants"][t] | {"part": carried.parts[t]}
                                            for t in tenants}, part_tenants=carried.held)
    w.prune_parts(carried.parts)
    new = StoreReader(old, w.publish(manifest))
    for tenant in tenants:
        assert new.view(VIEW_NODES, tenant).column("node_id").to_pylist() == \
            new.nodes(tenant).column("node_id").to_pylist()
        assert new.view(VIEW_TURNS, tenant).num_rows == base.manifest["tenants"][tenant]["turns"]
        assert new.view_meta(VIEW_TURNS, tenant)["matrix_ref"]["sessions"]
    assert _cache(old).get(tenants[0]).view_used
