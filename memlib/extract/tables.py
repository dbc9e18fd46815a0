"""Building node and edge tables from extracted records."""
from __future__ import annotations

import json
from typing import Any

import polars as pl
import pyarrow as pa

from memlib import schema
from memlib.schema import Source

EDGE_KEY = ["tenant_id", "src", "dst", "kind", "relation"]


def node_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows (dicts with NODES_NO_EMBEDDING keys; ``attributes`` may be a dict) -> conformed table."""
    for r in rows:
        if isinstance(r.get("attributes"), dict):
            r["attributes"] = json.dumps(r["attributes"], ensure_ascii=False, sort_keys=True, default=str)
        r.setdefault("source", Source.HEURISTIC.value)
    if not rows:
        return schema.empty(schema.NODES_NO_EMBEDDING)
    table = pa.Table.from_pylist(rows, schema=schema.NODES_NO_EMBEDDING)
    return schema.conform(table, schema.NODES_NO_EMBEDDING, name="nodes")


def edge_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Edge rows -> EDGES table; duplicate (tenant, src, dst, kind, relation) edges are merged,
    their provenance united (sorted) and the largest weight kept."""
    if not rows:
        return schema.empty(schema.EDGES)
    for r in rows:
        r.setdefault("weight", 1.0)
        r.setdefault("relation", None)
        r["kind"] = getattr(r["kind"], "value", r["kind"])
    table = pa.Table.from_pylist(rows, schema=schema.EDGES)
    df = pl.from_arrow(table)
    merged = (df.explode("provenance")
              .group_by(EDGE_KEY, maintain_order=True)
              .agg(pl.col("weight").max(), pl.col("provenance").drop_nulls().unique().sort()))
    return schema.conform(merged.to_arrow(), schema.EDGES, name="edges")
