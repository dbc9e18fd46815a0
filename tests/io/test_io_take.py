"""Rows of a many-chunk table taken column by column (memlib/io/take.py): the same values and schema
as ``pa.Table.take``, one chunk per column, and the digests and sorts built on it unchanged."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from memlib.compose.finalize import sorted_unique_nodes
from memlib.io import lance_checks
from memlib.io.lance_checks import rows_digest
from memlib.io.take import take, take_column
from tests.io.test_io_lance_checks import nodes


def _chunked(table: pa.Table, pieces: int) -> pa.Table:
    bounds = np.linspace(0, table.num_rows, pieces + 1).astype(int)
    return pa.concat_tables([table.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:])])


@pytest.mark.parametrize("pieces", [1, 3, 7])
def test_take_equals_arrows_take_as_one_chunk(pieces):
    t = _chunked(nodes(24, 5), pieces)
    rng = np.random.default_rng(pieces)
    for idx in (rng.permutation(24), rng.integers(0, 24, 40), np.zeros(0, np.int64)):
        got = take(t, idx)
        assert got.schema == t.schema
        assert got.equals(t.take(pa.array(idx, pa.int64())))
        assert all(got.column(c).num_chunks == 1 for c in got.column_names)
    assert take(t, pc.sort_indices(t.column("node_id"))).equals(t.take(pc.sort_indices(t.column("node_id"))))


def test_a_vector_column_with_nulls_or_a_slice_is_taken_as_arrow_takes_it():
    vecs = pa.array([[1.0, 2.0], None, [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float32(), 2))
    inner_null = pa.array([[1.0, None], [3.0, 4.0]], pa.list_(pa.float32(), 2))
    sliced = pa.chunked_array([vecs.slice(2), vecs.slice(0, 1)])
    for col, idx in ((vecs, [3, 1, 0]), (inner_null, [1, 0]), (sliced, [2, 0, 1])):
        want = (col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col).take(pa.array(idx, pa.int64()))
        assert take_column(col, np.asarray(idx)).equals(want)


def test_digest_and_sort_of_a_hundred_chunks_equal_those_of_one():
    t = nodes(300, 8)
    many = _chunked(t.take(pa.array(np.random.default_rng(1).permutation(300))), 100)
    assert rows_digest(many, "nodes") == rows_digest(t, "nodes")
    assert sorted_unique_nodes(many).equals(sorted_unique_nodes(t))


def _reference_digest(table: pa.Table) -> list[int]:
    """The digest as it was defined: every column of the rows sorted by node id, taken whole."""
    import zlib

    cols = lance_checks.row_columns(table, "nodes")
    table = table.select(cols).take(pc.sort_indices(table.column("node_id")))
    crc = 0
    for c in cols:
        crc = zlib.crc32(c.encode("utf-8"), crc)
        for part in lance_checks._bytes(table.column(c).combine_chunks()):
            crc = zlib.crc32(part, crc)
    return [table.num_rows, crc]


@pytest.mark.parametrize("null_vector", [False, True])
def test_the_digest_read_row_by_row_is_the_digest_of_the_sorted_copy(null_vector):
    """Published stores keep their digests: the vectors crc'd where they lie, in node id order, give
    the crc of the sorted copy (a vector column with a null row goes through the copy)."""
    t = nodes(50, 6)
    if null_vector:
        vecs = t.column("embedding").to_pylist()
        vecs[7] = None
        t = t.set_column(t.column_names.index("embedding"), t.schema.field("embedding"),
                         pa.array(vecs, t.schema.field("embedding").type))
    many = _chunked(t.take(pa.array(np.random.default_rng(2).permutation(50))), 9)
    assert rows_digest(many, "nodes") == _reference_digest(many) == _reference_digest(t)


def test_the_digest_of_many_chunks_never_copies_their_vectors_whole():
    """A tenant's published rows come back in a hundred chunks; their digest reads the vectors where
    they lie, a block of rows at a time: Arrow allocates far less than the vectors while it runs
    (combining the column was a 166 MB copy, fresh pages the kernel zeroes, on the 2,500-session
    tenant), and the digest is that of the rows in one chunk."""
    t = nodes(6000, 384)
    many = _chunked(t.take(pa.array(np.random.default_rng(4).permutation(6000))), 100)
    vector_bytes = 6000 * 384 * 4
    default = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(default)
    pa.set_memory_pool(pool)
    try:
        got = rows_digest(many, "nodes")
    finally:
        pa.set_memory_pool(default)
    assert got == rows_digest(t, "nodes") == _reference_digest(t)
    assert pool.max_memory() < vector_bytes / 4, pool.max_memory()
