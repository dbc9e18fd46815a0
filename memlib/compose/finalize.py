"""Last per-tenant step: drop edges whose endpoints do not exist, conform to the schemas."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.compose.rows import taken


@dataclass
class Finalized:
    nodes: pa.Table
    edges: pa.Table
    dropped_edges: int          # edges with a missing endpoint: a bug signal upstream
    dropped_by_kind: dict[str, int]


def _first_rows(nodes: pa.Table) -> pa.Array | None:
    """The row of each node id's first occurrence, in row order; None when every id is once."""
    if nodes.num_rows == 0 or pc.count_distinct(nodes.column("node_id"), mode="all").as_py() == nodes.num_rows:
        return None
    idx = pa.array(range(nodes.num_rows), pa.int64())
    first = (nodes.select(["node_id"]).append_column("_i", idx)
             .group_by("node_id", use_threads=False).aggregate([("_i", "min")]))
    col = first.column("_i_min")
    return pc.take(col, pc.sort_indices(col))


def sorted_unique_nodes(nodes: pa.Table) -> pa.Table:
    """One row per node id (its first occurrence), sorted by (kind, node_id): one take of the rows
    (the embeddings are most of a tenant's bytes: gathered from their chunks, not combined first)."""
    rows = _first_rows(nodes)
    keys = nodes.select(["kind", "node_id"])
    if rows is not None:
        keys = keys.take(rows)
    order = pc.sort_indices(keys, sort_keys=[("kind", "ascending"), ("node_id", "ascending")])
    return taken(nodes, order if rows is None else pc.take(rows, order))


def dedup_edges(edges: pa.Table) -> pa.Table:
    """One edge per (src, dst, kind, relation), first occurrence wins, order kept."""
    if edges.num_rows == 0:
        return edges
    keys = ["src", "dst", "kind", "relation"]
    key_tbl = edges.select(keys).append_column("_i", pa.array(range(edges.num_rows), pa.int64()))
    key_tbl = key_tbl.set_column(3, "relation", pc.fill_null(key_tbl.column("relation"), ""))
    first = key_tbl.group_by(keys, use_threads=False).aggregate([("_i", "min")])
    col = first.column("_i_min")
    return taken(edges, pc.take(col, pc.sort_indices(col)))


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
    edges = dedup_edges(schema.conform(edges, schema.EDGES, name="edges"))
    kept, dropped = drop_dangling(nodes, edges)
    kept = taken(kept, pc.sort_indices(kept, sort_keys=[("kind", "ascending"), ("src", "ascending"),
                                                        ("dst", "ascending")]))  # Table.sort_by, column by column
    return Finalized(nodes=nodes, edges=kept, dropped_edges=dropped.num_rows,
                     dropped_by_kind=kind_counts(dropped))
