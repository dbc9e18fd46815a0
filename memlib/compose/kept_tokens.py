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
from pathlib import Path

import numpy as np
import pyarrow as pa

from memlib.io.files import replace_arrow

TOKEN_DIM = 384


@dataclass
class KeptTokens:
    """Per turn (in the order asked for) its token count; per token its WordPiece id and scale; the
    int8 rows and the float16 vectors joined when ``int8_rows()`` / ``vectors()`` is called, and
    ``int8t()`` the int8 rows transposed as the kernel multiplies them, joined from the blocks'
    transposed sessions (None for blocks kept without them: the caller transposes the rows)."""
    counts: np.ndarray                          # (turns,) int64
    token_ids: np.ndarray                       # (tokens,) int32
    int8_rows: Callable[[], np.ndarray]         # -> (tokens, 384) int8
    scales: np.ndarray                          # (tokens,) float32
    vectors: Callable[[], np.ndarray]           # -> (tokens, 384) float16
    int8t: Callable[[], np.ndarray] | None = None  # -> (384, tokens) int8

    @property
    def int8(self) -> np.ndarray:
        return self.int8_rows()


# a block's int8 rows, transposed session by session (one row per session): the layout the int8
# kernel multiplies. A cold tenant's matrix is then a copy of each of its sessions' columns, where
# transposing its joined rows cost a LoCoMo tenant 3.5 of a cold query's ms
# (docs/decisions/0028-tenant-views.md)
INT8T = pa.schema([pa.field("session_key", pa.string(), nullable=False),
                   pa.field("tokens", pa.int64(), nullable=False),
                   pa.field("int8t", pa.binary(), nullable=False)])


def transposed_sessions(table: pa.Table) -> pa.Table | None:
    """The :data:`INT8T` table of a block's turn vectors ``table`` (a session's turns consecutive
    rows); None when it has no int8 rows or a session's rows are not consecutive."""
    c = _columns(table.combine_chunks()) if table.num_rows else None
    if c is None:
        return None
    keys = table.column("session_key").to_pylist()
    cuts = [0] + [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]] + [len(keys)]
    if len({keys[a] for a in cuts[:-1]}) != len(cuts) - 1:
        return None
    tok_off = c["token_ids"][0]
    int8_off, int8_data = c["token_int8"]
    out_keys, out_tokens, blobs = [], [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        rows = int8_data[int8_off[a]:int8_off[b]].view(np.int8).reshape(-1, TOKEN_DIM)
        if len(rows) != tok_off[b] - tok_off[a]:
            return None
        out_keys.append(keys[a])
        out_tokens.append(len(rows))
        blobs.append(np.ascontiguousarray(rows.T).tobytes())
    return pa.table([pa.array(out_keys, pa.string()), pa.array(out_tokens, pa.int64()), pa.array(blobs, pa.binary())],
                    schema=INT8T)


INT8T_FILE = "token_int8t.arrow"  # beside a kept block's turn_vectors.arrow


def int8t_path(bdir: Path) -> Path:
    return bdir / INT8T_FILE


def write_int8t(vectors: pa.Table, bdir: Path) -> pa.Table:
    """Write a kept block's transposed sessions from its turn vectors; returns the turn vectors to
    keep beside them: without their per-turn int8 rows (the same bytes, transposed: a quarter of
    a kept session's size), or as they are when they cannot be transposed (no int8 rows, a
    session's rows not consecutive)."""
    table = transposed_sessions(vectors)
    if table is None:
        int8t_path(bdir).unlink(missing_ok=True)
        return vectors
    replace_arrow(table, int8t_path(bdir))
    at = vectors.schema.get_field_index("token_int8")
    return vectors.set_column(at, vectors.schema.field(at), pa.nulls(vectors.num_rows, pa.binary()))


def read_int8t(bdir: Path) -> pa.Table | None:
    """A kept block's transposed sessions, mapped; None when it has none or they cannot be read (the
    reader transposes the rows instead)."""
    try:
        return pa.ipc.open_file(pa.memory_map(str(int8t_path(bdir)))).read_all()
    except (OSError, pa.ArrowException):
        return None


def _session_columns(t8: pa.Table | None) -> dict[str, np.ndarray] | None:
    """Session key -> its (384, tokens) transposed int8 rows, views of the mapped file; None when
    the block has none or they do not read back whole."""
    if t8 is None or t8.schema.names != INT8T.names or t8.column("int8t").num_chunks > 1:
        return None
    t8 = t8.combine_chunks()
    if t8.num_rows == 0:
        return {}
    offsets, data = _binary(t8.column("int8t").chunk(0))
    tokens = t8.column("tokens").to_numpy()
    if np.any(np.diff(offsets) != tokens * TOKEN_DIM):
        return None
    return {k: data[offsets[i]:offsets[i + 1]].view(np.int8).reshape(TOKEN_DIM, -1)
            for i, k in enumerate(t8.column("session_key").to_pylist())}


def _binary(chunk: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data bytes) of a binary chunk."""
    _, offsets_buf, data_buf = chunk.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[chunk.offset:chunk.offset + len(chunk) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64), data


def _columns(table: pa.Table) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """The block's token columns as (offsets, values) pairs, ``token_int8`` only when the block
    keeps its rows that way (blocks with transposed sessions do not); None when it cannot be read
    by runs (several chunks, nulls, or no scales: a block kept before int8 rows were)."""
    names = ("token_ids", "token_vectors", "token_scales")
    if any(n not in table.column_names for n in names):
        return None
    cols = {n: table.column(n) for n in names}
    if any(c.num_chunks != 1 or c.null_count for c in cols.values()):
        return None
    ids = cols["token_ids"].chunk(0)
    out = {"token_ids": (ids.offsets.to_numpy().astype(np.int64), ids.values.to_numpy(zero_copy_only=False))}
    out.update((n, _binary(cols[n].chunk(0))) for n in names[1:])
    rows = table.column("token_int8") if "token_int8" in table.column_names else None
    if rows is not None and rows.num_chunks == 1 and rows.null_count == 0:
        out["token_int8"] = _binary(rows.chunk(0))
    return out


def join(blocks: Sequence[tuple], turn_ids: Sequence[str]) -> KeptTokens | None:
    """The token arrays of ``turn_ids`` from ``blocks`` (each block's mapped turn vectors, the rows
    to take from it, and optionally its :data:`INT8T` table); None when those rows are not exactly
    these turns, or a block cannot be read by runs (the caller reads turn by turn)."""
    where = {t: i for i, t in enumerate(turn_ids)}
    cols, block_of, row_of, pos_of = [], [], [], []
    tables = [b[0] for b in blocks]
    sessions_t = [_session_columns(b[2]) if len(b) > 2 else None for b in blocks]
    for b, (table, rows, *_) in enumerate(blocks):
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
        scales, f16 = slices("token_scales", np.float32, 0), slices("token_vectors", np.float16, TOKEN_DIM)
        int8 = slices("token_int8", np.int8, TOKEN_DIM) if all("token_int8" in c for c in cols) else None
    except ValueError:  # bytes that are not whole rows
        return None
    n = int(counts.sum())
    if sum(len(x) for x in scales) != n or sum(len(x) for x in f16) != n or \
            (int8 is not None and sum(len(x) for x in int8) != n):
        return None  # rows that do not match their token ids: read turn by turn
    parts_t = _transposed_parts(runs, tables, sessions_t, cols)
    if parts_t is None and int8 is None:
        return None  # neither layout of the int8 rows for every run: read turn by turn

    join_ = (lambda parts, empty: np.concatenate(parts) if parts else empty)  # noqa: E731
    int8t = None if parts_t is None else (lambda: _hstack(parts_t, n))
    int8_rows = ((lambda: join_(int8, np.zeros((0, TOKEN_DIM), np.int8))) if int8 is not None
                 else (lambda: np.ascontiguousarray(int8t().T)))
    return KeptTokens(counts.astype(np.int64), join_(ids, np.zeros(0, np.int32)), int8_rows,
                      join_(scales, np.zeros(0, np.float32)), lambda: join_(f16, np.zeros((0, TOKEN_DIM), np.float16)),
                      int8t)


def _transposed_parts(runs: list[tuple[int, int, int]], tables: Sequence[pa.Table],
                      sessions_t: Sequence[dict[str, np.ndarray] | None],
                      cols: Sequence[dict[str, tuple[np.ndarray, np.ndarray]]]) -> list[np.ndarray] | None:
    """The transposed sessions that make up ``runs``, in order: each run is cut where its session
    changes, and each piece must hold all of its session's tokens; None when any does not (a
    block kept without transposed sessions, a session only partly asked for)."""
    parts = []
    for b, r0, r1 in runs:
        by_key = sessions_t[b]
        if by_key is None:
            return None
        keys = tables[b].column("session_key").slice(r0, r1 - r0).to_pylist()
        tok_off = cols[b]["token_ids"][0]
        start = r0
        for i in range(1, len(keys) + 1):
            if i < len(keys) and keys[i] == keys[i - 1]:
                continue
            part = by_key.get(keys[i - 1])
            if part is None or part.shape[1] != tok_off[r0 + i] - tok_off[start]:
                return None
            parts.append(part)
            start = r0 + i
    return parts


def _hstack(parts: Sequence[np.ndarray], n: int) -> np.ndarray:
    """The (384, n) int8 matrix of ``parts`` side by side: a copy per part of its contiguous columns."""
    out = np.empty((TOKEN_DIM, n), np.int8)
    at = 0
    for part in parts:
        out[:, at:at + part.shape[1]] = part
        at += part.shape[1]
    return out
