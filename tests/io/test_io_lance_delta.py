"""memlib.io.lance_delta: which Lance rows a rebuilt tenant changes, and importance read apart."""
from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa

from memlib import schema
from memlib.io.lance_delta import MAX_CHANGED_SHARE, lance_delta, lance_rows, with_importance

UTC = dt.timezone.utc


def _nodes(n: int, *, seed: int = 0, importance: float = 0.5) -> pa.Table:
    rng = np.random.default_rng(seed)
    emb = rng.random((n, schema.DEFAULT_EMBED_DIM), dtype=np.float32)
    rows = {"node_id": [f"n{i}" for i in range(n)], "tenant_id": ["t"] * n, "kind": ["fact"] * n,
            "text": [f"text {i}" for i in range(n)],
            "time": [dt.datetime(2023, 1, 1 + i % 20, tzinfo=UTC) for i in range(n)],
            "importance": [importance] * n, "provenance": [[f"turn{i}"] for i in range(n)],
            "attributes": ['{"a": 1}'] * n,
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), schema.DEFAULT_EMBED_DIM)}
    return schema.conform(pa.table(rows), schema.NODES, name="nodes")


def _replace(table: pa.Table, name: str, values: list) -> pa.Table:
    at = table.column_names.index(name)
    return table.set_column(at, table.schema.field(name), pa.array(values, table.schema.field(name).type))


def test_unchanged_rows_are_not_rewritten_and_importance_alone_is_no_change():
    old = _nodes(10)
    new = _replace(old, "importance", [0.9] * 10)  # every importance moved: no Lance row did
    d = lance_delta(new, old.drop_columns(["importance"]))
    assert d.delete == [] and d.rows.num_rows == 0


def test_each_column_change_a_removed_and_a_new_node_are_found():
    old = _nodes(20)
    new = _replace(old, "text", ["changed" if i == 1 else t for i, t in enumerate(old.column("text").to_pylist())])
    new = _replace(new, "provenance", [[] if i == 2 else p for i, p in enumerate(new.column("provenance").to_pylist())])
    attributes = new.column("attributes").to_pylist()
    new = _replace(new, "attributes", [None if i == 3 else a for i, a in enumerate(attributes)])
    new = _replace(new, "time", [None if i == 4 else t for i, t in enumerate(new.column("time").to_pylist())])
    emb = new.column("embedding").combine_chunks().values.to_numpy().reshape(20, -1).copy()
    emb[5, 7] = np.nextafter(emb[5, 7], np.float32(2))  # one ulp of one dimension
    new = new.set_column(new.column_names.index("embedding"), "embedding",
                         pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), emb.shape[1]))
    new = pa.concat_tables([new.slice(0, 19), _nodes(21, seed=3).slice(20, 1)])  # n19 removed, n20 new
    d = lance_delta(new, old.drop_columns(["importance"]))
    assert sorted(d.delete) == ["n1", "n19", "n2", "n3", "n4", "n5"]
    assert sorted(d.rows.column("node_id").to_pylist()) == ["n1", "n2", "n20", "n3", "n4", "n5"]
    assert d.rows.column("importance").null_count == d.rows.num_rows  # importance lives apart


def test_an_empty_provenance_list_is_not_a_null_one_and_items_keep_their_bounds():
    old = _nodes(10)
    old = _replace(old, "provenance", [[], ["a", "b"]] + old.column("provenance").to_pylist()[2:])
    new = _replace(old, "provenance", [None, ["a\x1fb"]] + old.column("provenance").to_pylist()[2:])
    assert sorted(lance_delta(new, old).delete) == ["n0", "n1"]
    assert lance_delta(old, old).delete == []


def test_a_large_change_replaces_the_tenant_whole():
    old = _nodes(10)
    changed = int(MAX_CHANGED_SHARE * 10) + 1
    texts = old.column("text").to_pylist()
    new = _replace(old, "text", [f"new {i}" if i < changed else t for i, t in enumerate(texts)])
    d = lance_delta(new, old)
    assert d.delete is None and d.rows.num_rows == 10
    assert lance_delta(new, None).delete is None


def test_importance_comes_from_its_table_else_from_the_row():
    nodes = _nodes(3, importance=0.25)
    imp = pa.table({"node_id": ["n2", "n0"], "importance": pa.array([0.75, 0.5], pa.float32())})
    assert with_importance(nodes, imp).column("importance").to_pylist() == [0.5, 0.25, 0.75]
    cleared = lance_rows(nodes)
    assert with_importance(cleared, imp).column("importance").to_pylist() == [0.5, None, 0.75]


def test_a_null_vector_equals_only_a_null_one_and_a_sliced_column_is_read_at_its_offset():
    old = _nodes(12)
    emb = old.column("embedding").combine_chunks()
    with_null = pa.FixedSizeListArray.from_arrays(emb.values, emb.type.list_size,
                                                  mask=pa.array([i in (2, 3) for i in range(12)]))
    at = old.column_names.index("embedding")
    old = old.set_column(at, old.schema.field("embedding"), with_null)
    new = old.set_column(at, old.schema.field("embedding"), emb)  # rows 2 and 3 get vectors
    new = pa.concat_tables([new.slice(0, 5), new.slice(5)])  # chunks with offsets
    d = lance_delta(new, old.drop_columns(["importance"]))
    assert sorted(d.delete) == ["n2", "n3"]
    same = lance_delta(old.slice(1), old.drop_columns(["importance"]))
    assert same.delete == ["n0"] and same.rows.num_rows == 0


def test_published_rows_keyed_ahead_give_the_same_delta_and_stale_keys_are_not_used():
    from memlib.io.lance_delta import keyed_rows

    old = _nodes(20).drop_columns(["importance"])
    texts = old.column("text").to_pylist()
    new = _replace(_nodes(20), "text", ["changed" if i == 4 else t for i, t in enumerate(texts)])
    new = new.slice(0, 19)  # n19 removed
    keyed = keyed_rows(old)
    d = lance_delta(new, old, keyed)
    assert d.delete == ["n4", "n19"] and d.rows.column("node_id").to_pylist() == ["n4"]
    # keys of other rows (another tenant's, an older read) are made again from ``old``
    other = keyed_rows(old.slice(0, 5))
    again = lance_delta(new, old, other)
    assert again.delete == d.delete and again.rows.equals(d.rows)
    assert lance_delta(new, old, (["node_id"], keyed[1])).delete == d.delete
