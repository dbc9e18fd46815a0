"""A tenant's ``schema.NODE_FALLBACKS`` rows (:func:`fallbacks_table`), and the :func:`clue_key`
of its clues.

After a nightly run most nodes keep the :class:`~memlib.compose.span_pool.Fallback` they were
published with (:func:`memlib.compose.reuse.pooled_reusing`): its ``ids``, ``counts`` and ``local``
are views of a row of the published table (``Fallback.row``). The new table's columns are one
Arrow take of those rows (and of the few made here), not a concatenation of one view per node
(82.5k nodes of the 2,500-session tenant; its ``local`` column is 126 MB). Their order differs
from the published one in nearly every row, so slices of the published columns would be one
chunk per row.
"""
from __future__ import annotations

import hashlib

import numpy as np
import polars as pl
import pyarrow as pa

from memlib import schema
from memlib.compose.rows import float32_blobs, int32_lists
from memlib.compose.span_pool import Fallback, is_clue
from memlib.io.take import take_column

LIST_COLUMNS = ("ids", "counts", "local")  # what a Fallback holds of its row


def clue_key(text: str | None, provenance: list[str] | None) -> str:
    """What a clue's pooled vector depends on besides the tenant's token rows: its text and its
    provenance turns, hashed (``node_fallbacks.inputs``)."""
    blob = (text or "") + "\x1e" + "\x1f".join(provenance or [])
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def clue_keys(nodes: pa.Table, rows: np.ndarray) -> list[str]:
    """:func:`clue_key` of each node row ``rows``."""
    take = pa.array(np.asarray(rows, dtype=np.int64))
    return [clue_key(t, p) for t, p in zip(nodes.column("text").take(take).to_pylist(),
                                          nodes.column("provenance").take(take).to_pylist())]


def fallbacks_table(nodes: pa.Table, fallbacks: dict[int, Fallback], published: pa.Table | None = None) -> pa.Table:
    """``schema.NODE_FALLBACKS`` rows of the derived nodes of ``nodes`` (one per node id), clues
    with their :func:`clue_key`. ``published``: the ``ids``, ``counts`` and ``local`` columns of the
    published table whose rows the fallbacks with a ``row`` were read from; those rows are taken
    from it, not from one view per node."""
    rows = np.fromiter(sorted(fallbacks), np.int64, len(fallbacks))
    node_ids = take_column(nodes.column("node_id"), rows)
    # one row per node id, its first: chosen before the columns are built (no filtered copy of them)
    first = pl.from_arrow(node_ids).is_first_distinct().to_numpy()
    rows, node_ids = rows[first], node_ids.filter(pa.array(first))
    fb = [fallbacks[r] for r in rows.tolist()]
    clue = is_clue(nodes, rows)
    keys = iter(clue_keys(nodes, rows[clue]))
    inputs = [next(keys) if c else None for c in clue.tolist()]
    table = pa.table({"tenant_id": take_column(nodes.column("tenant_id"), rows), "node_id": node_ids,
                      **fallback_columns(fb, published), "inputs": pa.array(inputs, pa.string())})
    return schema.conform(table, schema.NODE_FALLBACKS, name="node_fallbacks")


def fallback_columns(fb: list[Fallback], published: pa.Table | None) -> dict[str, pa.ChunkedArray]:
    """The ``ids``, ``counts`` and ``local`` columns of ``fb``'s rows, in ``schema.NODE_FALLBACKS``'
    types: one take of the rows of ``published`` that fallbacks were read from and of the others,
    made in one concatenation."""
    types = {c: schema.NODE_FALLBACKS.field(c).type for c in LIST_COLUMNS}
    src = np.fromiter((f.row for f in fb), np.int64, len(fb))
    if published is None or not (src >= 0).any():
        return {c: pa.chunked_array([a], types[c]) for c, a in _made(fb).items()}
    new = src < 0
    made = _made([f for f, n in zip(fb, new.tolist()) if n])
    # per row: its row in the published columns, or after them its row among the made ones
    at = np.where(new, published.num_rows + np.cumsum(new) - 1, src)
    columns = {}
    for c in LIST_COLUMNS:
        chunks = [*published.column(c).chunks, made[c]]
        chunks = [ch if ch.type.equals(types[c]) else ch.cast(types[c]) for ch in chunks]
        columns[c] = pa.chunked_array(chunks, types[c]).take(pa.array(at))  # one gather, in Arrow
    return columns


def _made(fb: list[Fallback]) -> dict[str, pa.Array]:
    return {"ids": int32_lists([f.ids for f in fb]), "counts": int32_lists([f.counts for f in fb]),
            "local": float32_blobs([f.local for f in fb])}
