"""Rows of a many-chunk Arrow table taken in a new order, column by column.

A tenant's tables reach the tenant steps in many chunks: its Lance rows come back one chunk per
fragment batch (106 for the 2,500-session tenant), and its nodes are concatenated from copied and
rebuilt pieces. ``pa.Table.take`` over such a table resolves every index against every chunk and
cost 0.9-1.0 s for the 108,043 rows of that tenant, twice per nightly run (the digest of its
published rows, the sort of its new ones). Taking each column once its chunks are combined gives
the same values in a tenth of that; a vector column (fixed-size list of floats without nulls) is
gathered as a numpy matrix.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa


def _gathered_vectors(col: pa.FixedSizeListArray, idx: np.ndarray) -> pa.Array | None:
    """``col.take(idx)`` as a numpy gather, for a fixed-size list of primitive values without
    nulls at either level; None otherwise."""
    values = col.values
    plain = pa.types.is_primitive(values.type) and not pa.types.is_boolean(values.type)
    if col.null_count or values.null_count or not plain:
        return None
    dim = col.type.list_size
    flat = values.slice(col.offset * dim, len(col) * dim).to_numpy(zero_copy_only=True)
    taken = np.ascontiguousarray(flat.reshape(len(col), dim)[idx]).reshape(-1)
    return pa.FixedSizeListArray.from_arrays(pa.array(taken, values.type), dim)


def take_column(col: pa.ChunkedArray | pa.Array, idx: np.ndarray) -> pa.Array:
    """``col.take(idx)`` (``idx``: int64 positions, no nulls), as one chunk."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if isinstance(arr, pa.FixedSizeListArray):
        out = _gathered_vectors(arr, idx)
        if out is not None:
            return out
    return arr.take(pa.array(idx, pa.int64()))


def take(table: pa.Table, indices: np.ndarray | pa.Array | pa.ChunkedArray) -> pa.Table:
    """``table.take(indices)``, the same schema and values, every column one chunk."""
    if isinstance(indices, (pa.Array, pa.ChunkedArray)):
        indices = indices.to_numpy() if isinstance(indices, pa.Array) else indices.combine_chunks().to_numpy()
    idx = np.asarray(indices, dtype=np.int64)
    return pa.Table.from_arrays([take_column(table.column(i), idx) for i in range(table.num_columns)],
                                schema=table.schema)


# rows compared or normalized per step: a block's temporaries (a few MB) are reused by the allocator,
# where a tenant-wide one (108k x 384 float32 = 166 MB) is fresh pages the kernel zeroes each time
# and unmaps when freed (docs/decisions/0045-tenant-temporaries.md)
BLOCK_ROWS = 4096


class VectorRows:
    """A vector column (fixed-size lists of float32 without nulls inside a vector) read as rows of
    float32 bits where they lie, chunk by chunk: no chunk is combined or copied whole."""

    def __init__(self, col: pa.ChunkedArray | pa.Array) -> None:
        chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
        self.dim = col.type.list_size
        self.valid = np.concatenate([c.is_valid().to_numpy(zero_copy_only=False) for c in chunks]) \
            if chunks else np.zeros(0, bool)
        self.views = [c.values.slice(c.offset * self.dim, len(c) * self.dim).to_numpy(zero_copy_only=True)
                      .view(np.uint32).reshape(len(c), self.dim) for c in chunks]
        self.starts = np.cumsum([0] + [len(c) for c in chunks])[:-1].astype(np.int64)

    @staticmethod
    def of(col: pa.ChunkedArray | pa.Array) -> VectorRows | None:
        """None when ``col`` is not a fixed-size list of float32, or a vector holds a null value."""
        chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
        if not (pa.types.is_fixed_size_list(col.type) and pa.types.is_float32(col.type.value_type)):
            return None
        if any(c.values.slice(c.offset * col.type.list_size, len(c) * col.type.list_size).null_count for c in chunks):
            return None
        return VectorRows(col)

    def rows(self, idx: np.ndarray, buffer: np.ndarray | None = None) -> np.ndarray:
        """The (len(idx), dim) uint32 bits of rows ``idx`` (a null row's are whatever it stores),
        written into the first rows of ``buffer`` when given (a uint32 array of ``dim`` columns and at
        least ``len(idx)`` rows, reused from block to block: numpy's fresh 6 MB blocks came from the
        kernel, zeroed, about every other block)."""
        out = np.empty((idx.size, self.dim), np.uint32) if buffer is None else buffer[:idx.size]
        if idx.size and (idx.min() < 0 or idx.max() >= self.valid.size):
            raise IndexError(f"rows {idx.min()}..{idx.max()} of {self.valid.size}")
        # checked above, so taken with mode="clip": numpy's default mode gathers into a temporary first
        if len(self.views) == 1:
            np.take(self.views[0], idx, axis=0, out=out, mode="clip")
            return out
        chunk = np.searchsorted(self.starts, idx, side="right") - 1
        for c in np.unique(chunk):
            at = np.flatnonzero(chunk == c)
            if at[-1] - at[0] + 1 == at.size:  # a run of the output: gathered in place
                np.take(self.views[c], idx[at[0]:at[-1] + 1] - self.starts[c], axis=0, out=out[at[0]:at[-1] + 1],
                        mode="clip")
            else:  # a block at a time: no temporary of all the chunk's rows
                for s in range(0, at.size, BLOCK_ROWS):
                    b = at[s:s + BLOCK_ROWS]
                    out[b] = self.views[c][idx[b] - self.starts[c]]
        return out


def rows_equal(a: VectorRows, a_idx: np.ndarray, b: VectorRows, b_idx: np.ndarray) -> np.ndarray:
    """Per pair (``a[a_idx[i]]``, ``b[b_idx[i]]``): the same bits, computed :data:`BLOCK_ROWS` pairs
    at a time."""
    same = np.zeros(a_idx.size, dtype=bool)
    n = min(BLOCK_ROWS, a_idx.size)
    a_rows, b_rows = np.empty((n, a.dim), np.uint32), np.empty((n, b.dim), np.uint32)  # reused per block
    for s in range(0, a_idx.size, BLOCK_ROWS):
        e = min(s + BLOCK_ROWS, a_idx.size)
        same[s:e] = (a.rows(a_idx[s:e], a_rows) == b.rows(b_idx[s:e], b_rows)).all(axis=1)
    return same
