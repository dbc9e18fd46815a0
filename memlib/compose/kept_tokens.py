"""A tenant's kept token arrays joined in the order of its turns, run by run: what ``auto``'s token
matrix is made of when a server opens a tenant (memlib/retrieve/matrix_cache.py).

The kept sessions' ``turn_vectors`` files (memlib/compose/session_store.py) hold one row per turn,
a session's turns consecutive and in order. A tenant's turns in conversation order are then a few
runs of consecutive rows, one or so per session, and each column of a run is one slice of the
mapped file's buffers. Joining the runs costs a copy per column and session, where a view per turn
and column cost a LoCoMo tenant 3.5 ms of Python and joining them 3 ms more.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

TOKEN_DIM = 384


@dataclass
class KeptTokens:
    """Per turn (in the order asked for) its token count; per token its WordPiece id, int8 row and
    scale; the float16 vectors joined when ``vectors()`` is called."""
    counts: np.ndarray                   # (turns,) int64
    token_ids: np.ndarray                # (tokens,) int32
    int8: np.ndarray                     # (tokens, 384) int8
    scales: np.ndarray                   # (tokens,) float32
    vectors: Callable[[], np.ndarray]    # -> (tokens, 384) float16


def _binary(chunk: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data bytes) of a binary chunk."""
    _, offsets_buf, data_buf = chunk.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[chunk.offset:chunk.offset + len(chunk) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64), data


def _columns(table: pa.Table) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """The block's token columns as (offsets, values) pairs; None when it cannot be read by runs
    (several chunks, nulls, or no int8 rows: a block kept before they were)."""
    names = ("token_ids", "token_vectors", "token_int8", "token_scales")
    if any(n not in table.column_names for n in names):
        return None
    cols = {n: table.column(n) for n in names}
    if any(c.num_chunks != 1 or c.null_count for c in cols.values()):
        return None
    ids = cols["token_ids"].chunk(0)
    out = {"token_ids": (ids.offsets.to_numpy().astype(np.int64), ids.values.to_numpy(zero_copy_only=False))}
    out.update((n, _binary(cols[n].chunk(0))) for n in names[1:])
    return out


def join(blocks: Sequence[tuple[pa.Table, np.ndarray]], turn_ids: Sequence[str]) -> KeptTokens | None:
    """The token arrays of ``turn_ids`` from ``blocks`` (each block's mapped turn vectors and the rows
    to take from it); None when those rows are not exactly these turns, or a block cannot be read
    by runs (the caller reads turn by turn)."""
    where = {t: i for i, t in enumerate(turn_ids)}
    cols, block_of, row_of, pos_of = [], [], [], []
    for b, (table, rows) in enumerate(blocks):
        c = _columns(table)
        if c is None:
            return None
        names = table.column("node_id").take(pa.array(rows)).to_pylist()
        pos = np.fromiter((where.get(n, -1) for n in names), dtype=np.int64, count=len(names))
        if pos.size and pos.min() < 0:
            return None
        cols.append(c)
        block_of.append(np.full(len(rows), b, np.int64))
        row_of.append(np.asarray(rows, np.int64))
        pos_of.append(pos)
    pos = np.concatenate(pos_of) if pos_of else np.zeros(0, np.int64)
    if pos.size != len(turn_ids) or not np.array_equal(np.sort(pos), np.arange(len(turn_ids))):
        return None
    order = np.argsort(pos, kind="stable")
    block, row = np.concatenate(block_of)[order], np.concatenate(row_of)[order]
    cuts = np.flatnonzero((np.diff(block) != 0) | (np.diff(row) != 1)) + 1
    starts, ends = np.r_[0, cuts], np.r_[cuts, len(row)]
    runs = [(int(block[a]), int(row[a]), int(row[e - 1]) + 1) for a, e in zip(starts, ends)]

    def slices(name: str, dtype, width: int) -> list[np.ndarray]:
        out = []
        for b, r0, r1 in runs:
            offsets, data = cols[b][name]
            if name == "token_ids":
                out.append(np.asarray(data[offsets[r0]:offsets[r1]], dtype=np.int32))
            else:
                out.append(data[offsets[r0]:offsets[r1]].view(dtype).reshape(-1, width) if width
                           else data[offsets[r0]:offsets[r1]].view(dtype))
        return out

    counts = np.concatenate([np.diff(cols[b]["token_ids"][0][r0:r1 + 1]) for b, r0, r1 in runs]) if runs \
        else np.zeros(0, np.int64)
    try:
        ids = slices("token_ids", np.int32, 0)
        int8, scales, f16 = slices("token_int8", np.int8, TOKEN_DIM), slices("token_scales", np.float32, 0), \
            slices("token_vectors", np.float16, TOKEN_DIM)
    except ValueError:  # bytes that are not whole rows
        return None
    n = int(counts.sum())
    if sum(len(x) for x in int8) != n or sum(len(x) for x in scales) != n or sum(len(x) for x in f16) != n:
        return None  # rows that do not match their token ids: read turn by turn

    def vectors() -> np.ndarray:
        return np.concatenate(f16) if f16 else np.zeros((0, TOKEN_DIM), np.float16)

    join_ = (lambda parts, empty: np.concatenate(parts) if parts else empty)  # noqa: E731
    return KeptTokens(counts.astype(np.int64), join_(ids, np.zeros(0, np.int32)),
                      join_(int8, np.zeros((0, TOKEN_DIM), np.int8)), join_(scales, np.zeros(0, np.float32)),
                      vectors)
