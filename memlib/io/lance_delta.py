"""What a rebuilt tenant changes in the Lance ``nodes`` table: a nightly run replaces only the
rows that changed, not the tenant's whole history (docs/decisions/0030-lance-rows-by-node.md).

A node's Lance row is everything the store holds of it but its importance (kept apart,
``schema.NODE_IMPORTANCE``): its id, text, times, provenance, attributes and vector. A run that
appended a session to a tenant leaves most of those rows as published, so the tenant's rows are
compared with its published ones, column by column (vectors by their bytes), and the write
deletes the changed and removed ids and adds the changed and new rows. The table then holds the
same rows as after a whole-tenant rewrite, so searches and the full-text statistics are the
same; the index merge follows the rows added, not the tenant's size.

Rows with ``importance`` set are written with it cleared: the value is read from the
``node_importance`` table (:meth:`memlib.io.store.StoreReader.nodes`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.io.take import VectorRows, rows_equal

# above this share of a tenant's rows changed, a whole-tenant delete is cheaper than a delete of
# each id (and the delete's predicate stays short)
MAX_CHANGED_SHARE = 0.5
MAX_DELETE_IDS = 100_000


@dataclass
class LanceDelta:
    """A rebuilt tenant's change to the Lance rows: ``rows`` to add, ``delete`` ids to remove first
    (``delete`` None: the tenant's rows are replaced whole)."""
    rows: pa.Table
    delete: list[str] | None


def lance_rows(nodes: pa.Table) -> pa.Table:
    """``nodes`` as the Lance table stores them: importance cleared (it lives in ``node_importance``)."""
    if "importance" not in nodes.column_names:
        return nodes
    at = nodes.column_names.index("importance")
    return nodes.set_column(at, nodes.schema.field("importance"), pa.nulls(nodes.num_rows, pa.float32()))


def row_columns(table: pa.Table) -> list[str]:
    """The columns a Lance row is compared on: every column of the nodes schema but importance."""
    return [f.name for f in schema.NODES if f.name != "importance" and f.name in table.column_names]


def _comparable(table: pa.Table, columns: list[str]):
    """``table``'s ``columns`` in a form polars joins on (lists as strings)."""
    import polars as pl

    frame = pl.from_arrow(table.select(columns))
    lists = [n for n in columns if isinstance(frame.schema[n], pl.List)]
    # a list as one string, each item prefixed by its length (no separator is ambiguous) and the
    # whole by "[" (an empty list is not a null one)
    return frame.with_columns(
        (pl.lit("[") + pl.col(n).list.eval(pl.element().str.len_bytes().cast(pl.String) + ":" + pl.element())
         .list.join("")).alias(n) for n in lists)


def _vector_bits(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(valid mask, the vectors' float32 bits as uint32 rows) of a vector column (a row of another
    length than the others counts as not valid: it equals no vector of the other side)."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(col.type):
        dim = col.type.list_size
        flat = col.values.slice(col.offset * dim, len(col) * dim).to_numpy(zero_copy_only=False)
        return valid, np.ascontiguousarray(flat, dtype=np.float32).view(np.uint32).reshape(len(col), dim)
    rows = [np.asarray(v if v is not None else [], np.float32).view(np.uint32) for v in col.to_pylist()]
    width = max((r.size for r in rows), default=0)
    fits = np.array([r.size == width for r in rows], dtype=bool)
    bits = np.stack([r if r.size == width else np.zeros(width, np.uint32) for r in rows]) if rows else np.zeros((0, 0))
    return valid & fits if rows else valid, bits


def _same_vectors(new: pa.ChunkedArray, rows: np.ndarray, old: pa.ChunkedArray, prev: np.ndarray) -> np.ndarray:
    """Per pair (``new[rows[i]]``, ``old[prev[i]]``): the same vector to the bit, or both null.
    Float32 vectors are compared where they lie, a block of pairs at a time (no tenant-wide copy)."""
    nr, orows = VectorRows.of(new), VectorRows.of(old)
    if nr is not None and orows is not None and nr.dim == orows.dim:
        nv, ov = nr.valid[rows], orows.valid[prev]
        both = nv & ov
        same = ~nv & ~ov
        same[both] = rows_equal(nr, rows[both], orows, prev[both])
        return same
    nv, nb = _vector_bits(new)
    ov, ob = _vector_bits(old)
    if nb.shape[1:] != ob.shape[1:]:
        return ~nv[rows] & ~ov[prev]
    both = nv[rows] & ov[prev]
    same = ~nv[rows] & ~ov[prev]
    same[both] = (nb[rows[both]] == ob[prev[both]]).all(axis=1)
    return same


def keyed_rows(old: pa.Table) -> tuple[list[str], Any]:
    """``old``'s rows as :func:`lance_delta` joins them (the key columns, and a polars frame of them
    with each row's position). Made where a tenant's published rows are read, on the thread that
    reads them ahead (pipelines/prefetch.py), not after the tenant steps: for the 2,500-session
    tenant it is a third of the delta's time."""
    keys = [c for c in row_columns(old) if c != "embedding"]
    return keys, _comparable(old, keys).with_row_index("_prev")


def lance_delta(new: pa.Table, old: pa.Table | None, old_keyed: tuple[list[str], Any] | None = None) -> LanceDelta:
    """The change from a tenant's published Lance rows ``old`` to its rows ``new`` (both nodes
    tables; ``old`` None: not published under a comparable build, so the tenant is replaced whole).
    ``old_keyed``: :func:`keyed_rows` of ``old``, when made already."""
    rows = lance_rows(new)
    if old is None or old.num_rows == 0:
        return LanceDelta(rows, None)
    columns = row_columns(new)
    if set(columns) - set(old.column_names):
        return LanceDelta(rows, None)
    keys = [c for c in columns if c != "embedding"]  # vectors compared apart, as bits (no bytes copied)
    if old_keyed is None or old_keyed[0] != keys or old_keyed[1].height != old.num_rows:
        old_keyed = keyed_rows(old.select(keys))
    now, before = _comparable(new, keys).with_row_index("_row"), old_keyed[1]
    pairs = now.join(before, on=keys, how="inner", nulls_equal=True)
    at, prev = pairs["_row"].to_numpy().astype(np.int64), pairs["_prev"].to_numpy().astype(np.int64)
    if "embedding" in columns:
        at = at[_same_vectors(new.column("embedding"), at, old.column("embedding"), prev)]
    unchanged = np.zeros(new.num_rows, dtype=bool)
    unchanged[at] = True
    # the ids as Arrow sets, not Python ones (two sets and a list of 108k strings each, under the GIL
    # the graph's thread also wants)
    new_ids, old_ids = new.column("node_id"), old.column("node_id")
    kept_ids = pc.filter(new_ids, pa.array(unchanged))
    deleted = old_ids.filter(pc.invert(pc.is_in(old_ids, value_set=kept_ids)))
    removed = int(pc.sum(pc.invert(pc.is_in(pc.unique(deleted), value_set=new_ids))).as_py() or 0)
    changed = int((~unchanged).sum())
    if len(deleted) > MAX_DELETE_IDS or changed + removed > MAX_CHANGED_SHARE * max(1, old.num_rows):
        return LanceDelta(rows, None)
    return LanceDelta(rows.filter(pa.array(~unchanged)), deleted.to_pylist())


def with_importance(nodes: pa.Table, importance: pa.Table | None) -> pa.Table:
    """``nodes`` (Lance rows, ``node_id`` and ``importance`` among their columns) with each node's
    importance from ``importance`` (``node_importance`` rows) where it has one; a node it lacks (a
    tenant of a store written before the table) keeps the importance of its row."""
    if importance is None or importance.num_rows == 0 or nodes.num_rows == 0:
        return nodes
    at = pc.index_in(nodes.column("node_id"), importance.column("node_id"))
    found = pc.take(importance.column("importance"), at)
    merged = pc.coalesce(found, nodes.column("importance").cast(pa.float32()))
    i = nodes.column_names.index("importance")
    return nodes.set_column(i, nodes.schema.field("importance"), merged)
