"""Last per-tenant step: drop edges whose endpoints do not exist, conform to the schemas."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.compose.rows import take_runs, taken


@dataclass
class Finalized:
    nodes: pa.Table
    edges: pa.Table
    dropped_edges: int          # edges with a missing endpoint: a bug signal upstream
    dropped_by_kind: dict[str, int]


def first_of(table: pa.Table, keys: list[str]) -> np.ndarray:
    """Per row: whether it is the first with its values of ``keys`` (a null equals a null)."""
    return pl.from_arrow(table.select(keys)).select(pl.struct(keys).is_first_distinct()).to_series().to_numpy()


def _first_rows(nodes: pa.Table) -> np.ndarray | None:
    """The row of each node id's first occurrence, in row order; None when every id is once."""
    if nodes.num_rows == 0:
        return None
    first = first_of(nodes, ["node_id"])
    return None if first.all() else np.flatnonzero(first)


def sorted_unique_nodes(nodes: pa.Table) -> pa.Table:
    """One row per node id (its first occurrence), sorted by (kind, node_id): one take of the rows
    (the embeddings are most of a tenant's bytes: gathered from their chunks, not combined first)."""
    rows = _first_rows(nodes)
    keys = nodes.select(["kind", "node_id"])
    if rows is not None:
        keys = keys.take(rows)
    order = pc.sort_indices(keys, sort_keys=[("kind", "ascending"), ("node_id", "ascending")]).to_numpy()
    idx = order if rows is None else rows[order]
    if np.array_equal(idx, np.arange(idx.size)):  # the leading rows, in order (:func:`in_final_order`)
        return one_chunk(nodes.slice(0, idx.size))  # no copy of the embeddings
    return taken(nodes, idx)


def one_chunk(table: pa.Table) -> pa.Table:
    """``table`` with every column one chunk (a column already one chunk is not copied)."""
    cols = [c.chunk(0) if c.num_chunks == 1 else c.combine_chunks() for c in table.columns]
    return pa.Table.from_arrays(cols, schema=table.schema)


def in_final_order(nodes: pa.Table) -> pa.Table:
    """``nodes`` with the clue rows first, in their order, then the first row of each other node id,
    sorted by (kind, node_id), then the other rows of a repeated id, in their order. The embed step
    pools the vectors in this order: after the clue merge (the merged clues, sorted, take the last
    rows of the clues' place) finalize's sorted unique nodes are the leading rows, in order, and
    their 166 MB of vectors need no sorted copy (docs/decisions/0050-vectors-in-final-order.md)."""
    if nodes.num_rows == 0:
        return nodes
    clue = pc.fill_null(pc.equal(nodes.column("kind"), schema.NodeKind.CLUE.value), False).to_numpy(
        zero_copy_only=False)
    first = first_of(nodes, ["node_id"])
    main = np.flatnonzero(~clue & first)
    keys = take_runs(nodes.select(["kind", "node_id"]), main)
    order = pc.sort_indices(keys, sort_keys=[("kind", "ascending"), ("node_id", "ascending")]).to_numpy()
    return take_runs(nodes, np.concatenate([np.flatnonzero(clue), main[order], np.flatnonzero(~clue & ~first)]))


def dedup_edges(edges: pa.Table) -> pa.Table:
    """One edge per (src, dst, kind, relation), first occurrence wins, order kept."""
    if edges.num_rows == 0:
        return edges
    keys = ["src", "dst", "kind", "relation"]
    keyed = edges.select(keys)
    keyed = keyed.set_column(3, "relation", pc.fill_null(keyed.column("relation"), ""))  # no relation == ""
    return edges.filter(pa.array(first_of(keyed, keys)))


def drop_dangling(nodes: pa.Table, edges: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(kept edges, dropped edges): an edge is kept when both endpoints are node ids."""
    ids = nodes.column("node_id")
    ok = pc.and_(pc.is_in(edges.column("src"), value_set=ids), pc.is_in(edges.column("dst"), value_set=ids))
    return edges.filter(ok), edges.filter(pc.invert(ok))


def kind_counts(table: pa.Table, column: str = "kind") -> dict[str, int]:
    if table.num_rows == 0:
        return {}
    vc = pc.value_counts(table.column(column)).to_pylist()
    return {str(d["values"]): int(d["counts"]) for d in sorted(vc, key=lambda d: str(d["values"]))}


def finalize(nodes: pa.Table, edges: pa.Table, dim: int) -> Finalized:
    """Deduplicate, drop dangling edges (counted), sort deterministically and conform."""
    nodes = sorted_unique_nodes(schema.conform(nodes, schema.nodes_schema(dim), name="nodes"))
    # the edges come in a chunk per step and kept session (10k for a 2,500-session tenant): every
    # operation below is several times faster on one chunk, which costs one copy of the edges
    edges = dedup_edges(schema.conform(edges, schema.EDGES, name="edges").combine_chunks())
    kept, dropped = drop_dangling(nodes, edges)
    kept = taken(kept, pc.sort_indices(kept, sort_keys=[("kind", "ascending"), ("src", "ascending"),
                                                        ("dst", "ascending")]))  # Table.sort_by, column by column
    return Finalized(nodes=nodes, edges=kept, dropped_edges=dropped.num_rows,
                     dropped_by_kind=kind_counts(dropped))
