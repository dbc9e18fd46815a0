"""Building node and edge tables from extracted records."""
from __future__ import annotations

import json
import math
from typing import Any

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
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        r.setdefault("weight", 1.0)
        r.setdefault("relation", None)
        r["kind"] = getattr(r["kind"], "value", r["kind"])
        groups.setdefault(tuple(r.get(k) for k in EDGE_KEY), []).append(r)
    merged = [{**dict(zip(EDGE_KEY, key)), "weight": _max_weight([r["weight"] for r in group]),
               "provenance": sorted({p for r in group for p in r.get("provenance") or () if p is not None})}
              for key, group in groups.items()]
    return schema.conform(pa.Table.from_pylist(merged, schema=schema.EDGES), schema.EDGES, name="edges")


def _max_weight(weights: list[float | None]) -> float | None:
    """The largest weight, nulls and NaNs ignored; NaN when all are NaN, null when all are null."""
    present = [w for w in weights if w is not None]
    numbers = [w for w in present if not math.isnan(w)]
    if numbers:
        return max(numbers)
    return math.nan if present else None
