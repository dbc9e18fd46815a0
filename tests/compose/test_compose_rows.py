"""Row selections of a tenant's tables (memlib/compose/rows.py) and the steps that use them: the same
values as Arrow's take and filter, with no copy of the rows when they are a few runs, vectors
gathered from their chunks where they lie, and finalize's deduplication and sort unchanged."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from memlib import schema
from memlib.compose.finalize import dedup_edges, finalize, sorted_unique_nodes
from memlib.compose.reference import _in_session_order
from memlib.compose.rows import (
    copy_vectors_into,
    equal_missing,
    filter_runs,
    float32_blobs,
    gather_vectors,
    int32_lists,
    pooled_into,
    same_lists,
    take_runs,
    taken,
)
from memlib.compose.vectors import TurnVectors, pooled_vectors
from tests.io.test_io_lance_checks import nodes


def _chunked(table: pa.Table, pieces: int) -> pa.Table:
    bounds = np.linspace(0, table.num_rows, pieces + 1).astype(int)
    return pa.concat_tables([table.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:])])


def _vector_buffers(table: pa.Table) -> list[tuple[int, int]]:
    """(address, size) of the float buffer of each chunk of the ``embedding`` column."""
    return [(c.values.buffers()[1].address, c.values.buffers()[1].size) for c in table.column("embedding").chunks]


def _inside(table: pa.Table, source: pa.Table) -> bool:
    """Whether every vector chunk of ``table`` lies in a buffer of ``source`` (no copy was made)."""
    spans = _vector_buffers(source)
    return all(any(a <= addr < a + n for a, n in spans) for addr, _ in _vector_buffers(table))


def test_a_new_session_inside_a_kept_blocks_range_moves_without_copying_the_rows():
    """A nightly's kept blocks are in session order but for a new session (here s2, read last):
    it moves to its place as slices of the table read; the old code took the rows between, a copy."""
    t = nodes(40, 8)
    keys = ["s0"] * 10 + ["s1"] * 10 + ["s3"] * 10 + ["s2"] * 10
    t = _chunked(t.append_column("session_key", pa.array(keys)), 2)
    order = pa.array(["s0", "s1", "s2", "s3"])
    got = _in_session_order(t, order)
    rank = np.asarray([order.to_pylist().index(k) for k in keys])
    assert got.equals(t.take(pa.array(np.argsort(rank, kind="stable"))))
    assert _inside(got, t)


@pytest.mark.parametrize("pieces", [1, 4])
def test_take_runs_and_filter_runs_equal_arrows_take_and_filter(pieces):
    t = _chunked(nodes(50, 4), pieces)
    mask = np.zeros(50, bool)
    mask[5:17] = mask[30:41] = True
    got = filter_runs(t, mask)
    assert got.equals(t.filter(pa.array(mask))) and _inside(got, t)
    assert filter_runs(t, pa.array(~mask)).equals(t.filter(pa.array(~mask)))
    assert filter_runs(t, pa.array([None] + [True] * 49)).equals(t.slice(1))
    many = np.arange(0, 50, 2)  # 25 runs of one row: taken, not sliced
    assert take_runs(t, many, max_runs=8).equals(t.take(pa.array(many)))
    assert take_runs(t, np.zeros(0, np.int64)).num_rows == 0
    assert take_runs(t, np.arange(50)) is t


def test_vectors_gathered_from_chunks_equal_a_take_of_the_combined_column():
    t = nodes(60, 8)
    col = pa.chunked_array([t.column("embedding").combine_chunks().slice(a, b - a)
                            for a, b in ((0, 7), (7, 33), (33, 60))])  # chunks at offsets in one buffer
    idx = np.random.default_rng(2).permutation(60)
    want = col.combine_chunks().take(pa.array(idx))
    assert gather_vectors(col, idx).equals(want)
    assert gather_vectors(col.combine_chunks(), idx).equals(want)
    with_null = pa.array([[1.0, 2.0], None], pa.list_(pa.float32(), 2))
    assert gather_vectors(with_null, np.array([1, 0])) is None
    assert taken(_chunked(t, 5), idx).equals(t.take(pa.array(idx)))


def test_vectors_copied_into_rows_are_the_same_bits():
    t = _chunked(nodes(30, 8), 3)
    src = np.array([29, 0, 11, 12, 25])
    rows = np.array([4, 0, 2, 3, 1])
    out = np.zeros((5, 8), np.float32)
    copy_vectors_into(out, rows, t.column("embedding"), src)
    flat = t.column("embedding").combine_chunks().flatten().to_numpy().reshape(30, 8)
    assert np.array_equal(out[rows].view(np.uint32), flat[src].view(np.uint32))
    nulls = pa.chunked_array([pa.array([[1.0, 2.0], None, [3.0, 4.0]], pa.list_(pa.float32(), 2))])
    out = np.zeros((2, 2), np.float32)
    copy_vectors_into(out, np.array([1, 0]), nulls, np.array([0, 2]))
    assert out.tolist() == [[3.0, 4.0], [1.0, 2.0]]


def test_fallback_columns_built_at_once_equal_the_row_by_row_arrays():
    ids = [np.array([3, 1], np.int32), np.zeros(0, np.int32), np.array([7], np.int64)]
    assert int32_lists(ids).equals(pa.array([list(map(int, i)) for i in ids], pa.list_(pa.int32())))
    local = [None, np.arange(4, dtype=np.float32), np.ones(4, np.float64), None]
    want = pa.array([None if v is None else np.asarray(v, np.float32).tobytes() for v in local], pa.binary())
    got = float32_blobs(local)
    got.validate(full=True)
    assert got.equals(want)
    assert float32_blobs([np.ones(2, np.float32)]).equals(pa.array([np.ones(2, np.float32).tobytes()]))
    assert int32_lists([]).equals(pa.array([], pa.list_(pa.int32()))) and len(float32_blobs([])) == 0


def _reference_dedup(edges: pa.Table) -> pa.Table:
    seen, keep = set(), []
    for e in edges.to_pylist():
        key = (e["src"], e["dst"], e["kind"], e["relation"] or "")
        keep.append(key not in seen)
        seen.add(key)
    return edges.filter(pa.array(keep))


def test_finalize_deduplicates_and_sorts_many_chunks_as_row_by_row():
    rng = np.random.default_rng(5)
    n = 300
    edges = schema.conform(pa.table({"tenant_id": ["t"] * n,
        "src": [f"n{i}" for i in rng.integers(0, 12, n)], "dst": [f"n{i}" for i in rng.integers(0, 14, n)],
        "kind": rng.choice(["NEXT", "SIMILAR"], n).tolist(),
        "relation": rng.choice(np.array(["", "r", None], dtype=object), n).tolist(),
        "weight": rng.random(n).tolist()}), schema.EDGES, name="edges")
    many = _chunked(edges, 40)
    assert dedup_edges(many).equals(_reference_dedup(edges))
    t = nodes(12, 4)
    dup = _chunked(pa.concat_tables([t, t.slice(3, 4)]), 6)  # later copies of n3..n6 are dropped
    got = sorted_unique_nodes(dup)
    want = t.take(pc.sort_indices(t, sort_keys=[("kind", "ascending"), ("node_id", "ascending")]))
    assert got.equals(want)
    done = finalize(dup, many, 4)
    kept = _reference_dedup(edges)
    ids = set(t.column("node_id").to_pylist())
    kept = kept.filter(pa.array([s in ids and d in ids for s, d in zip(kept.column("src").to_pylist(),
                                                                         kept.column("dst").to_pylist())]))
    assert done.edges.equals(kept.sort_by([("kind", "ascending"), ("src", "ascending"), ("dst", "ascending")]))
    assert done.nodes.equals(want) and done.dropped_edges == _reference_dedup(edges).num_rows - kept.num_rows


def test_lists_and_values_compared_in_columns_equal_the_row_by_row_comparison():
    """What pooled_reusing compares of a node and its published row (reuse._unchanged): values with
    two nulls equal, lists by length and values in order; a null list is not an empty one."""
    a = [["t1", "t2"], ["t1"], None, [], ["t2", "t1"], ["x", None], None, ["a\x1fb"], ["t3"], []]
    b = [["t1", "t2"], ["t1", "t2"], None, None, ["t1", "t2"], ["x", None], ["t1"], ["a", "b"], ["t4"], []]
    want = [x == y for x, y in zip(a, b)]
    got = same_lists(pa.array(a, pa.list_(pa.string())), pa.array(b, pa.list_(pa.string())))
    assert got.tolist() == want
    texts, others = ["a", None, "b", None, ""], ["a", None, "c", "d", None]
    assert equal_missing(pa.array(texts), pa.array(others)).tolist() == [x == y for x, y in zip(texts, others)]


@pytest.mark.parametrize("rows", [np.arange(3, 9), np.array([0, 2, 3, 7, 8, 11])])
def test_vectors_pooled_in_place_are_the_bits_of_the_pooled_matrix(rows):
    """pooled_into writes a run of rows (the turns, in finalize's order) in place, and any other rows
    by assignment: either way the bits of pooled_vectors."""
    rng = np.random.default_rng(9)
    tv = TurnVectors([f"t{i}" for i in range(5)], rng.standard_normal((5, 7)).astype(np.float32))
    cited = [[f"t{i % 5}", f"t{(i * 3) % 5}"] if i % 4 else [] for i in range(rows.size)]  # some cite none
    prov = pa.table({"provenance": pa.array(cited, pa.list_(pa.string()))})
    want = pooled_vectors(prov, tv.node_ids, tv.vectors)
    out = np.full((12, 7), 5.0, np.float32)
    pooled_into(out, rows, prov, tv)
    assert np.array_equal(out[rows].view(np.uint32), want.view(np.uint32))
    assert (np.delete(out, rows, axis=0) == 5.0).all()
