"""LLM events (MAGMA): events with entities, topic and ISO dates, then causal links inferred on
each session's 2-hop neighbourhood (event -> shared entity -> event), MAGMA's slow path."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import polars as pl

from memlib.config import Backend
from memlib.extract.base import Extraction, ExtractionContext, ExtractResult, register
from memlib.extract.entities import entity_id
from memlib.extract.llm_common import Unit, call_units, client_of, numbered, run_stage
from memlib.extract.rows import EventAttributes, NodeRow, derived_from, event_id, mentions
from memlib.extract.tables import edge_table, node_table
from memlib.ids import make_id
from memlib.llm.models import EventsOut, Task
from memlib.schema import EdgeKind, NodeKind

MAX_NEIGHBOURHOOD = 8


def _date(values: list[str]) -> datetime | None:
    for v in values:
        parts = (v.strip() + "-01-01").split("-")[:3]
        try:
            return datetime(int(parts[0]), int(parts[1] or 1), int(parts[2] or 1), tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


def convert(unit: Unit, out: EventsOut, model: str) -> ExtractResult:
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    for ev in out.events:
        prov = unit.turns_at(ev.turns)
        if not prov:
            continue
        nid = event_id(unit.tenant_id, prov[0], ev.text)
        when = _date(ev.dates) or unit.session_time
        attrs = EventAttributes(entities=ev.entities, topic=ev.topic, dates_mentioned=ev.dates)
        nodes.append(NodeRow(NodeKind.EVENT, nid, unit.tenant_id, ev.text, prov, attrs,
                             conversation_id=unit.conversation_id, session_id=unit.session_id, time=when,
                             valid_from=when).row())
        edges += derived_from(unit.tenant_id, nid, prov)
        edges += mentions(unit.tenant_id, nid, [entity_id(unit.tenant_id, e) for e in ev.entities if e.strip()], prov)
    return ExtractResult(node_table(nodes), edge_table(edges))


def variables(u: Unit) -> dict[str, str]:
    return {"turns": u.lines, "session_date": u.session_date}


class _Hood:
    def __init__(self, unit_id: str, tenant_id: str, events: list[dict[str, Any]]):
        self.unit_id, self.tenant_id, self.events = unit_id, tenant_id, events


def neighbourhoods(res: ExtractResult) -> list[_Hood]:
    """Per session: its events plus events elsewhere sharing an entity with them (2 hops)."""
    ev = pl.from_arrow(res.nodes.select(["node_id", "tenant_id", "conversation_id", "session_id", "text",
                                         "time"])).filter(pl.col("node_id").str.starts_with("event:"))
    mentions = (pl.from_arrow(res.edges.select(["src", "dst", "kind"]))
                .filter((pl.col("kind") == EdgeKind.MENTIONS.value) & pl.col("src").str.starts_with("event:")))
    pairs = (mentions.join(mentions, on="dst").filter(pl.col("src") != pl.col("src_right"))
             .select(pl.col("src").alias("a"), pl.col("src_right").alias("b"))
             .unique().sort(["a", "b"]))  # a stable order keeps prompts (and cache keys) identical
    hoods = []
    for (tenant, _conv, _sid), grp in ev.group_by(["tenant_id", "conversation_id", "session_id"], maintain_order=True):
        own = sorted(grp["node_id"].to_list())
        near = pairs.filter(pl.col("a").is_in(own) & ~pl.col("b").is_in(own))["b"].unique().sort()
        ids = (own + near.to_list())[:MAX_NEIGHBOURHOOD]
        if len(ids) < 2:
            continue
        rows = ev.filter(pl.col("node_id").is_in(ids)).sort(["time", "node_id"]).to_dicts()
        hoods.append(_Hood(make_id("llmunit", Task.CAUSAL.value, tenant, *sorted(ids)), tenant, rows))
    return hoods


def causal_edges(ctx: ExtractionContext, res: ExtractResult) -> ExtractResult:
    hoods = neighbourhoods(res) if res.nodes.num_rows else []
    by_id = {h.unit_id: h for h in hoods}
    calls = call_units(client_of(ctx), Task.CAUSAL, list(by_id.values()), _causal_vars, ctx.config.llm.concurrency)
    edges = []
    for call in calls:
        if not call.ok:
            continue
        hood, out = by_id[call.unit_id], call.output
        for link in out.links:
            n = len(hood.events)
            if 0 <= link.cause < n and 0 <= link.effect < n and link.cause != link.effect:
                edges.append({"tenant_id": hood.tenant_id, "src": hood.events[link.cause]["node_id"],
                              "dst": hood.events[link.effect]["node_id"], "kind": EdgeKind.CAUSES,
                              "relation": link.why[:200] or None, "provenance": []})
    return ExtractResult(res.nodes, edge_table(edges)) if edges else ExtractResult(res.nodes)


def _causal_vars(h: _Hood) -> dict[str, str]:
    return {"events": numbered([f"({e['time']:%Y-%m-%d}) {e['text']}" if e["time"] else e["text"]
                                for e in h.events])}


@register
class LLMEvents:
    name = Extraction.EVENTS
    backend = Backend.LLM

    def run(self, ctx: ExtractionContext) -> ExtractResult:
        res = run_stage(ctx, Extraction.EVENTS, Task.EVENTS, variables, convert)
        links = causal_edges(ctx, res)
        return ExtractResult.concat([res, ExtractResult(edges=links.edges)])
