"""One ``attributes`` contract per derived node kind, whichever backend wrote the node.

The stages read each other's nodes through these keys: heuristic events take the facts whose
``dated_by_mention`` is true, reflections group facts by ``speaker`` and ``concept_ids``, entity
linking reads ``entities``. A backend that cannot fill a key from its own output gets it from the
fact's text and source turn (:func:`complete_facts`), so the LLM facts stage can feed the
heuristic events and reflections and the other way round.
"""
from __future__ import annotations

import json
from typing import Any

import polars as pl
import pyarrow as pa

from memlib.extract.events import event_time
from memlib.extract.rows import (
    ConceptAttributes,
    EventAttributes,
    FactAttributes,
    ReflectionAttributes,
    TripletAttributes,
)
from memlib.schema import NodeKind

FACT_KEYS = FactAttributes.contract()
EVENT_KEYS = EventAttributes.contract()
REFLECTION_KEYS = ReflectionAttributes.contract()
CONTRACT = {NodeKind.FACT.value: FACT_KEYS, NodeKind.EVENT.value: EVENT_KEYS,
            NodeKind.REFLECTION.value: REFLECTION_KEYS, NodeKind.CONCEPT.value: ConceptAttributes.contract(),
            NodeKind.TRIPLET.value: TripletAttributes.contract()}


def missing_keys(nodes: pa.Table) -> dict[str, list[str]]:
    """node id -> contract keys its ``attributes`` lack (empty when every node complies)."""
    out = {}
    for row in nodes.select(["node_id", "kind", "attributes"]).to_pylist():
        keys = CONTRACT.get(row["kind"])
        if keys:
            attrs = json.loads(row["attributes"] or "{}")
            lack = [k for k in keys if k not in attrs]
            if lack:
                out[row["node_id"]] = lack
    return out


def _turn_index(turns: pa.Table) -> dict[str, dict[str, Any]]:
    df = pl.from_arrow(turns.select(["node_id", "turn_id", "speaker", "session_time"]))
    return {r["node_id"]: r for r in df.iter_rows(named=True)}


def _complete(row: dict[str, Any], turns: dict[str, dict[str, Any]]) -> dict[str, Any]:
    attrs = json.loads(row["attributes"] or "{}")
    first = turns.get((row["provenance"] or [None])[0]) or {}
    anchor = first.get("session_time") or row["time"]
    when, mentions = event_time(row["text"], anchor)
    concepts = attrs.get("concepts") or []
    filled = FactAttributes(speaker=first.get("speaker"), turn_id=first.get("turn_id"),
                            dates_mentioned=[m.to_json() for m in mentions], dated_by_mention=bool(mentions),
                            topic=FactAttributes.topic_of(concepts), concepts=concepts,
                            concept_ids=attrs.get("concept_ids") or []).to_dict()
    out = {**filled, **attrs}
    if mentions and "dated_by_mention" not in attrs:
        row["time"] = when
    row["attributes"] = json.dumps(out, ensure_ascii=False, sort_keys=True, default=str)
    return row


def complete_facts(nodes: pa.Table, turns: pa.Table) -> pa.Table:
    """``nodes`` with every fact's attributes completed to :data:`FACT_KEYS` (keys a backend set are
    kept; a fact dated by a mention in its text takes that date as its ``time``, as heuristic facts do)."""
    if nodes.num_rows == 0 or "attributes" not in nodes.column_names:
        return nodes
    kinds = nodes.column("kind").to_pylist()
    if NodeKind.FACT.value not in kinds:
        return nodes
    index = _turn_index(turns)
    rows = nodes.to_pylist()
    rows = [_complete(r, index) if r["kind"] == NodeKind.FACT.value else r for r in rows]
    return pa.Table.from_pylist(rows, schema=nodes.schema)
