"""Row selections of a tenant's tables that make no tenant-sized copy when they need none.

A big tenant's nightly run moves, filters and sorts tables of 108k node rows whose ``embedding``
column is most of their bytes (108k x 384 float32 = 166 MB). Three kinds of selection were each a
fresh copy of it, and fresh pages cost their zeroing by the kernel as much as the copy
(docs/decisions/0045-tenant-temporaries.md):

- a selection that keeps whole runs of consecutive rows (the clue rows are one run, a new
  session's rows are one run moved to its place): :func:`take_runs` and :func:`filter_runs` return
  zero-copy slices of the table, concatenated, when there are few runs;
- a gather of every row in a new order (finalize's sort): :func:`taken` gathers a float32 vector
  column from its chunks where they lie, :data:`memlib.io.take.BLOCK_ROWS` rows at a time, into one
  output buffer, without combining the chunks first (the combined copy is another 166 MB).

The values are the same as ``table.take`` / ``table.filter``; only the chunking differs.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.compose.vectors import TurnVectors, pooled_vectors
from memlib.io.take import BLOCK_ROWS, VectorRows, take_column

# a selection of at most this many runs is made of slices (each slice is one more chunk per column)
MAX_RUNS = 64


def runs(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of the maximal runs of consecutive positions in ``idx`` (each run's
    positions are ``start, start + 1, ...``), in the order of ``idx``."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    first = np.r_[0, breaks]
    return idx[first], np.diff(np.r_[first, idx.size])


def take_runs(table: pa.Table, idx: np.ndarray, max_runs: int = MAX_RUNS) -> pa.Table:
    """``table.take(idx)`` (``idx``: int64 positions, no nulls): zero-copy slices of ``table`` when
    ``idx`` is at most ``max_runs`` runs of consecutive rows, else a take column by column."""
    start, length = runs(idx)
    if start.size > max_runs:
        return taken(table, idx)
    if start.size == 1 and start[0] == 0 and length[0] == table.num_rows:
        return table
    if start.size == 0:
        return table.slice(0, 0)
    return pa.concat_tables([table.slice(int(s), int(n)) for s, n in zip(start.tolist(), length.tolist())])


def filter_runs(table: pa.Table, mask: pa.Array | pa.ChunkedArray | np.ndarray) -> pa.Table:
    """``table.filter(mask)`` (a null in ``mask`` drops its row), as slices when the kept rows are
    few runs (:func:`take_runs`)."""
    if not isinstance(mask, np.ndarray):
        mask = pc.fill_null(mask, False).to_numpy(zero_copy_only=False)
    return take_runs(table, np.flatnonzero(mask))


def gather_vectors(col: pa.ChunkedArray | pa.Array, idx: np.ndarray) -> pa.FixedSizeListArray | None:
    """``col.take(idx)`` for a float32 vector column without nulls, gathered from the chunks where
    they lie into one buffer (:meth:`memlib.io.take.VectorRows.rows`); None for any other column."""
    view = VectorRows.of(col)
    if view is None or col.null_count:
        return None
    out = view.rows(idx)
    return pa.FixedSizeListArray.from_arrays(pa.array(out.view(np.float32).reshape(-1), pa.float32()), view.dim)


def taken(table: pa.Table, idx: np.ndarray | pa.Array | pa.ChunkedArray) -> pa.Table:
    """``table.take(idx)``, every column one chunk: :func:`memlib.io.take.take`, with its vector
    columns gathered by :func:`gather_vectors` (no combined copy of their chunks)."""
    if isinstance(idx, pa.ChunkedArray):
        idx = idx.combine_chunks()
    idx = np.asarray(idx.to_numpy() if isinstance(idx, pa.Array) else idx, dtype=np.int64)
    cols = []
    for i in range(table.num_columns):
        col = table.column(i)
        vec = gather_vectors(col, idx) if pa.types.is_fixed_size_list(col.type) else None
        cols.append(vec if vec is not None else take_column(col, idx))
    return pa.Table.from_arrays(cols, schema=table.schema)


def turn_rows(nodes: pa.Table) -> np.ndarray:
    """The rows of ``nodes`` that are turns."""
    return np.flatnonzero(pc.fill_null(pc.equal(nodes.column("kind"), schema.NodeKind.TURN.value), False)
                          .to_numpy(zero_copy_only=False))


def provenance_of(nodes: pa.Table, rows: np.ndarray) -> pa.Table:
    """The ``provenance`` column of the node rows ``rows``: all that
    :func:`memlib.compose.vectors.pooled_vectors` reads of them (not a take of every column)."""
    return pa.table({"provenance": take_column(nodes.column("provenance"), rows)})


def copy_vectors_into(out: np.ndarray, rows: np.ndarray, col: pa.ChunkedArray, src_rows: np.ndarray) -> None:
    """``out[rows] = col[src_rows]`` (``col`` a vector column, ``out`` float32), read where the rows
    lie a block at a time: no combined or gathered copy of the whole column."""
    view = VectorRows.of(col)
    if view is None or col.null_count:
        if rows.size:
            out[rows] = take_column(col, src_rows).flatten().to_numpy(zero_copy_only=False).reshape(rows.size, -1)
        return
    bits = out.view(np.uint32)
    block = np.empty((min(BLOCK_ROWS, rows.size), view.dim), np.uint32)  # reused: no fresh 6 MB per block
    for s in range(0, rows.size, BLOCK_ROWS):
        bits[rows[s:s + BLOCK_ROWS]] = view.rows(src_rows[s:s + BLOCK_ROWS], block)


def int32_lists(parts: list[np.ndarray]) -> pa.ListArray:
    """``pa.array(parts, pa.list_(pa.int32()))`` (no nulls) from one concatenation, not row by row."""
    offsets = np.zeros(len(parts) + 1, np.int32)
    np.cumsum([p.size for p in parts], out=offsets[1:])
    flat = np.concatenate(parts, axis=None, dtype=np.int32) if parts else np.zeros(0, np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.int32()))


def float32_blobs(parts: list[np.ndarray | None]) -> pa.BinaryArray:
    """``pa.array([None if p is None else p.astype(float32).tobytes() for p in parts], pa.binary())``
    from one concatenation, not one bytes object per row."""
    valid = np.fromiter((p is not None for p in parts), bool, len(parts))
    sizes = np.fromiter((0 if p is None else p.size * 4 for p in parts), np.int64, len(parts))
    offsets = np.zeros(len(parts) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    kept = [p for p in parts if p is not None]  # flattened and cast as they are concatenated
    data = np.concatenate(kept, axis=None, dtype=np.float32).view(np.uint8) if kept else np.zeros(0, np.uint8)
    bitmap = pa.array(valid).buffers()[1] if not valid.all() else None
    return pa.Array.from_buffers(pa.binary(), len(parts), [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=int((~valid).sum()))


def equal_missing(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Per row: ``a == b``, two nulls equal (a null and a value not)."""
    eq = pc.fill_null(pc.equal(a, b), False).to_numpy(zero_copy_only=False)
    if a.null_count or b.null_count:
        eq |= a.is_null().to_numpy(zero_copy_only=False) & b.is_null().to_numpy(zero_copy_only=False)
    return eq


def same_lists(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Per row of two list arrays: the same length and the same values in order (:func:`equal_missing`);
    two null lists are equal, a null list and an empty one are not."""
    la = pc.fill_null(pc.list_value_length(a), -1).to_numpy(zero_copy_only=False)
    lb = pc.fill_null(pc.list_value_length(b), -1).to_numpy(zero_copy_only=False)
    out = la == lb
    idx = np.flatnonzero(out)
    if idx.size == 0:
        return out
    take = pa.array(idx, pa.int64())
    eq = equal_missing(pc.list_flatten(a.take(take)), pc.list_flatten(b.take(take)))  # aligned: same lengths
    out[idx] = ~any_per_segment(~eq, np.maximum(la[idx], 0))
    return out


def any_per_segment(flags: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per segment of ``flags`` (consecutive runs of ``lengths``, in order): whether any flag is set."""
    hits = np.concatenate([[0], np.cumsum(flags)])  # flags set before each position
    ends = np.cumsum(lengths)
    return hits[ends] > hits[ends - lengths]


def pooled_into(out: np.ndarray, rows: np.ndarray, provenance: pa.Table, tv: TurnVectors) -> None:
    """``out[rows] = pooled_vectors(provenance, tv.node_ids, tv.vectors)``, the same bits; pooled in
    place when ``rows`` is one run of ``out`` (the turns, in finalize's order: no temporary of
    their vectors)."""
    start, length = runs(rows)
    if start.size == 1:
        pooled_vectors(provenance, tv.node_ids, tv.vectors, out=out[start[0]:start[0] + length[0]])
    elif rows.size:
        out[rows] = pooled_vectors(provenance, tv.node_ids, tv.vectors)
