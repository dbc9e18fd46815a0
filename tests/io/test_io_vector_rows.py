"""Tenant-wide vectors compared and normalized a block of rows at a time (docs/decisions/0045):
the same results as over the whole matrix, without a temporary of the whole matrix's size."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pytest

from memlib import schema
from memlib.compose.vectors import normalized_rows, pooled_vectors
from memlib.io.lance_delta import lance_delta
from memlib.io.take import BLOCK_ROWS, VectorRows, rows_equal

DIM = schema.DEFAULT_EMBED_DIM


def _column(vectors: np.ndarray, cuts: list[int]) -> pa.ChunkedArray:
    parts = np.split(vectors, cuts)
    return pa.chunked_array([pa.FixedSizeListArray.from_arrays(pa.array(p.ravel()), DIM) for p in parts])


def _peak(fn) -> int:
    """Bytes of the largest Python/numpy allocation peak while ``fn`` runs."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_rows_are_read_across_chunks_and_compared_to_the_bit():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3 * BLOCK_ROWS + 17, DIM)).astype(np.float32)
    b = a.copy()
    b[5, 3] = np.nextafter(b[5, 3], np.float32(np.inf))  # one ulp
    b[-1, 0] = -b[-1, 0] if b[-1, 0] != 0 else 1.0
    col_a, col_b = _column(a, [7, 100, BLOCK_ROWS + 3]), _column(b, [2 * BLOCK_ROWS])
    va, vb = VectorRows.of(col_a), VectorRows.of(col_b)
    idx = rng.permutation(len(a))
    assert np.array_equal(va.rows(idx), a.view(np.uint32)[idx])
    same = rows_equal(va, idx, vb, idx)
    assert np.array_equal(same, ~np.isin(idx, [5, len(a) - 1]))
    assert VectorRows.of(pa.chunked_array([pa.array([[1.0, 2.0]], pa.list_(pa.float64(), 2))])) is None


def test_normalized_rows_are_the_bits_of_the_whole_matrix_division():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((2 * BLOCK_ROWS + 5, DIM)) * rng.random((2 * BLOCK_ROWS + 5, 1)) * 50).astype(np.float32)
    x[3] = 0.0
    want = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    got = normalized_rows(x.copy())
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_pooling_many_nodes_holds_no_second_matrix_of_their_size():
    n = 6 * BLOCK_ROWS
    rng = np.random.default_rng(3)
    turns = rng.standard_normal((n, DIM)).astype(np.float32)
    ids = [f"t{i}" for i in range(n)]
    nodes = pa.table({"provenance": pa.array([[ids[i]] for i in range(n)], pa.list_(pa.string()))})
    out_bytes = n * DIM * 4
    want = turns / np.maximum(np.linalg.norm(turns, axis=1, keepdims=True), 1e-12)
    got: list[np.ndarray] = []
    peak = _peak(lambda: got.append(pooled_vectors(nodes, ids, turns)))
    assert np.array_equal(got[0].view(np.uint32), want.view(np.uint32))
    # the output, plus a block's temporaries (a whole-matrix norm and quotient were 2 more outputs)
    assert peak < 1.5 * out_bytes, (peak, out_bytes)


def test_the_lance_delta_compares_vectors_without_a_copy_of_the_column():
    from tests.io.test_io_lance_delta import _nodes

    n = 5 * BLOCK_ROWS
    old = _nodes(n)
    emb = old.column("embedding")
    old = old.set_column(old.column_names.index("embedding"), "embedding",
                         pa.chunked_array([emb.combine_chunks().slice(s, 997) for s in range(0, n, 997)]))
    vectors = emb.combine_chunks().values.to_numpy().reshape(n, DIM).copy()
    vectors[10, 0] += 1.0
    new = old.set_column(old.column_names.index("embedding"), "embedding",
                         pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM))
    got = []
    peak = _peak(lambda: got.append(lance_delta(new, old.drop_columns(["importance"]))))
    assert got[0].delete == ["n10"] and got[0].rows.column("node_id").to_pylist() == ["n10"]
    # the two columns' gathered bits were 2 x n x DIM x 4 bytes of numpy arrays
    assert peak < 0.5 * n * DIM * 4, (peak, n * DIM * 4)


def test_rows_go_into_a_given_buffer_and_a_digest_holds_one_block_of_them():
    from memlib.io.lance_checks import rows_digest

    rng = np.random.default_rng(4)
    n = 6 * BLOCK_ROWS + 11
    a = rng.standard_normal((n, DIM)).astype(np.float32)
    col = _column(a, [5, BLOCK_ROWS + 1, 3 * BLOCK_ROWS])
    view, idx = VectorRows.of(col), rng.permutation(n)[:BLOCK_ROWS]
    buffer = np.empty((BLOCK_ROWS, DIM), np.uint32)
    got = view.rows(idx[:100], buffer)
    assert np.shares_memory(got, buffer) and np.array_equal(got, a.view(np.uint32)[idx[:100]])
    assert np.array_equal(view.rows(idx), a.view(np.uint32)[idx])
    with pytest.raises(IndexError):
        view.rows(np.array([0, n]), buffer)
    # one chunk, as the tenant steps leave a tenant's nodes
    table = pa.table({"node_id": pa.array([f"n{i:06d}" for i in range(n)])[::-1], "embedding": col.combine_chunks()})
    digest = []
    peak = _peak(lambda: digest.append(rows_digest(table, "nodes")))
    assert digest[0] == rows_digest(table.take(pa.array(np.argsort(np.arange(n)[::-1]))), "nodes")
    # one block's rows reused (a new block per step held two of them while the next was gathered)
    block = BLOCK_ROWS * DIM * 4
    assert peak < 1.5 * block, (peak, block)
