"""MAGMA events: dates mentioned and a normalized event time per fact.

:func:`event_time` is what the fact extractor uses to date a fact. The ``events`` stage
turns every fact whose time comes from a date it mentions (not merely the session date)
into an ``event`` node carrying MAGMA's attributes (entities, topic, dates_mentioned),
derived from the same turn, so temporal queries can anchor on dated events.
"""
from __future__ import annotations

import json
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from memlib.config import Backend
from memlib.extract.base import Extraction, ExtractionContext, ExtractResult, register
from memlib.extract.rows import derived_from, event_id
from memlib.extract.tables import edge_table, node_table
from memlib.schema import NodeKind
from memlib.text.dates import DateMention, Granularity, resolve_dates

_DATED = (Granularity.DAY, Granularity.WEEK, Granularity.MONTH)


def pick_event_time(mentions: list[DateMention], anchor: datetime | None) -> datetime | None:
    """The event time implied by ``mentions``: the first day/week/month-level mention
    (a year alone is too coarse), else the first mention, else ``anchor``."""
    for m in mentions:
        if m.granularity in _DATED:
            return m.resolved
    return mentions[0].resolved if mentions else anchor


def event_time(text: str, anchor: datetime | None) -> tuple[datetime | None, list[DateMention]]:
    """(normalized event time, date mentions) of ``text`` said at ``anchor``."""
    mentions = resolve_dates(text, anchor) if anchor is not None else []
    return pick_event_time(mentions, anchor), mentions


@register
class HeuristicEvents:
    name = Extraction.EVENTS
    backend = Backend.HEURISTIC

    def run(self, ctx: ExtractionContext) -> ExtractResult:
        if ctx.facts is None or ctx.facts.num_rows == 0:
            return ExtractResult()
        facts = ctx.facts.filter(pc.equal(ctx.facts.column("kind"), NodeKind.FACT.value))
        dated = facts.filter(pa.array([_dated_by_mention(a) for a in facts.column("attributes").to_pylist()],
                                      pa.bool_())).to_pylist()
        nodes, edges = [], []
        for f in dated:
            nid = event_id(f["tenant_id"], f["node_id"])
            nodes.append({**{k: f[k] for k in ("tenant_id", "conversation_id", "text", "time", "valid_from",
                                                 "session_id", "provenance", "attributes", "source")},
                          "node_id": nid, "kind": NodeKind.EVENT.value})
            edges += derived_from(f["tenant_id"], nid, f["provenance"])
        return ExtractResult(node_table(nodes), edge_table(edges))


def _dated_by_mention(attributes: str | None) -> bool:
    """Whether a fact's attributes hold ``"dated_by_mention": true`` (or the string ``"true"``)."""
    value = json.loads(attributes).get("dated_by_mention") if attributes else None
    return value is True or value == "true"
