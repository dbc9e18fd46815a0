"""GAAMA facts + concepts from kept turns (heuristic backend).

Each declarative, non-phatic sentence of a kept turn becomes a fact with the speaker
named in place of first person and relative dates made explicit. Concepts come from the
sentence's noun chunks and are canonicalized per tenant.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import pyarrow as pa

from memlib import schema
from memlib.config import Backend
from memlib.extract.base import Extraction, ExtractionContext, ExtractResult, register
from memlib.extract.concepts import canonicalize, chunks_by_sentence, concept_labels
from memlib.extract.entities import ENTITY_LABELS
from memlib.extract.events import pick_event_time
from memlib.extract.parse import ParsedTurn, parsed_turns
from memlib.extract.person import rewrite_speaker
from memlib.extract.rows import ConceptAttributes, FactAttributes, NodeRow, concept_links, derived_from, fact_id
from memlib.extract.tables import edge_table, node_table
from memlib.ids import session_node_id
from memlib.schema import NodeKind
from memlib.text.dates import resolve_dates, rewrite_relative

_MAX_FACT_CHARS = 400


@dataclass
class RawFact:
    turn: ParsedTurn
    index: int
    text: str
    time: datetime | None
    dated_by_mention: bool
    dates: list[dict[str, Any]]
    entities: list[str]
    labels: list[str] = field(default_factory=list)

    @property
    def node_id(self) -> str:
        t = self.turn
        return fact_id(t.tenant_id, t.node_id, self.index, self.text)


def is_question(span: Any) -> bool:
    return span.text.rstrip().endswith("?")


def content_words(span: Any) -> int:
    return sum(1 for t in span if not (t.is_stop or t.is_punct or t.is_space or t.pos_ in ("INTJ", "X", "SYM")))


def is_imperative(span: Any) -> bool:
    """A bare-verb root with no subject ("Check out the pic!", "Keep it up")."""
    root = span.root
    return root.tag_ == "VB" and not any(c.dep_ in ("nsubj", "nsubjpass", "expl") for c in root.children)


def is_phatic(span: Any, min_content: int) -> bool:
    """Too little content, or no verb and no named entity (greetings, reactions, thanks)."""
    if content_words(span) < min_content:
        return True
    has_verb = any(t.pos_ in ("VERB", "AUX") for t in span)
    return not has_verb and not any(e.label_ in ENTITY_LABELS for e in span.ents)


def _names(turn: ParsedTurn) -> set[str]:
    return {w.lower() for s in (turn.speaker, turn.other_speaker) if s for w in s.split()}


def _sentence_fact(turn: ParsedTurn, index: int, sent: Any, limit: int, chunks: list[Any] | None = None) -> RawFact:
    rw = rewrite_speaker(sent, turn.speaker, turn.other_speaker)
    mentions = resolve_dates(rw.text, turn.session_time) if turn.session_time else []
    text = rewrite_relative(rw.text, turn.session_time, mentions) if mentions else rw.text
    ents = [e.text for e in sent.ents if e.label_ in ENTITY_LABELS]
    entities = list(dict.fromkeys(rw.people + ents))
    names = _names(turn) | {w.lower() for e in sent.ents if e.label_ == "PERSON" for w in e.text.split()}
    return RawFact(turn, index, text[:_MAX_FACT_CHARS], pick_event_time(mentions, turn.session_time),
                   bool(mentions), [m.to_json() for m in mentions], entities,
                   concept_labels(sent, names, limit, chunks))


def facts_of_turn(turn: ParsedTurn, min_content: int, limit: int) -> list[RawFact]:
    out = []
    chunks = chunks_by_sentence(turn.doc)
    for i, sent in enumerate(turn.doc.sents):
        if is_question(sent) or is_imperative(sent) or is_phatic(sent, min_content):
            continue
        out.append(_sentence_fact(turn, i, sent, limit, chunks.get(sent.start, [])))
    if turn.caption and turn.speaker:
        text = f"{turn.speaker} shared an image: {turn.caption}"
        out.append(RawFact(turn, len(out) + 1000, text[:_MAX_FACT_CHARS], turn.session_time, False, [],
                           [turn.speaker]))
    return out


def draft_table(raw: list[RawFact], session_key: str | dict[str, str] = "") -> pa.Table:
    """``raw`` facts as :data:`schema.FACT_DRAFTS` rows (concept labels not yet canonical).

    ``session_key`` is one key for all rows, or a map session node id -> key."""
    rows = []
    for f in raw:
        t = f.turn
        key = session_key if isinstance(session_key, str) else session_key[
            session_node_id(t.tenant_id, t.conversation_id, t.session_id)]
        rows.append({"session_key": key, "node_id": f.node_id, "tenant_id": t.tenant_id,
                     "conversation_id": t.conversation_id, "session_id": t.session_id,
                     "turn_node_id": t.node_id, "turn_id": t.turn_id, "speaker": t.speaker, "text": f.text,
                     "time": f.time, "dates": json.dumps(f.dates, ensure_ascii=False, default=str),
                     "dated_by_mention": f.dated_by_mention, "entities": f.entities, "labels": f.labels})
    if not rows:
        return schema.empty(schema.FACT_DRAFTS)
    return pa.Table.from_pylist(rows, schema=schema.FACT_DRAFTS)


def fact_row(f: dict[str, Any], concepts: list[tuple[str, str]]) -> dict[str, Any]:
    labels = [c for _, c in concepts]
    attrs = FactAttributes(speaker=f["speaker"], turn_id=f["turn_id"], dates_mentioned=json.loads(f["dates"] or "[]"),
                           dated_by_mention=bool(f["dated_by_mention"]), entities=f["entities"] or [],
                           topic=FactAttributes.topic_of(labels), concepts=labels,
                           concept_ids=[i for i, _ in concepts])
    return NodeRow(NodeKind.FACT, f["node_id"], f["tenant_id"], f["text"], [f["turn_node_id"]], attrs,
                   conversation_id=f["conversation_id"], session_id=f["session_id"], time=f["time"],
                   valid_from=f["time"], belief=1.0).row()


class _Link(NamedTuple):
    """A fact's link to one of its concepts (the first label of the fact that maps to it)."""
    tenant_id: str
    fact: str
    turn: str
    label: str
    concept_id: str
    canonical: str


def _links(rows: list[dict[str, Any]], threshold: float) -> list[_Link]:
    """Every (fact, concept) pair of the drafts once, in draft and label order."""
    occ = [(f["tenant_id"], f["node_id"], f["turn_node_id"], label)
           for f in rows for label in f["labels"] or () if label is not None]
    canon = canonicalize([(tenant, label) for tenant, _, _, label in occ], threshold)
    links: dict[tuple[str, str], _Link] = {}
    for tenant, fact, turn, label in occ:
        cid, canonical = canon[tenant, label]
        links.setdefault((fact, cid), _Link(tenant, fact, turn, label, cid, canonical))
    return list(links.values())


def _concept_rows(links: list[_Link]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[_Link]] = {}
    for link in links:
        groups.setdefault((link.tenant_id, link.concept_id), []).append(link)
    return [NodeRow(NodeKind.CONCEPT, cid, tenant, group[0].canonical.replace("_", " "),
                    sorted({g.turn for g in group}),
                    ConceptAttributes(label=group[0].canonical, aliases=sorted({g.label for g in group}),
                                       n_facts=len({g.fact for g in group}))).row()
            for (tenant, cid), group in groups.items()]


def _link_rows(links: list[_Link]) -> list[dict[str, Any]]:
    return [e for r in links for e in concept_links(r.tenant_id, r.fact, r.concept_id, [r.turn])]


def finish_drafts(drafts: pa.Table, threshold: float) -> ExtractResult:
    """Tenant-level half of the facts stage: canonicalize the concept labels of every fact draft
    of the tenant(s), then fact and concept nodes, DERIVED_FROM / HAS_CONCEPT / ABOUT_CONCEPT edges."""
    rows = schema.conform(drafts, schema.FACT_DRAFTS, name="fact_drafts").to_pylist()
    links = _links(rows, threshold)
    per_fact: dict[str, list[tuple[str, str]]] = {}
    for link in links:
        per_fact.setdefault(link.fact, []).append((link.concept_id, link.canonical))
    facts = [fact_row(f, per_fact.get(f["node_id"], [])) for f in rows]
    derived = [e for f in rows for e in derived_from(f["tenant_id"], f["node_id"], [f["turn_node_id"]])]
    nodes = node_table(facts + _concept_rows(links))
    return ExtractResult(nodes, edge_table(derived + _link_rows(links)))


def build_result(raw: list[RawFact], threshold: float) -> ExtractResult:
    return finish_drafts(draft_table(raw), threshold)


@register
class HeuristicFacts:
    name = Extraction.FACTS
    backend = Backend.HEURISTIC

    def draft(self, ctx: ExtractionContext, session_key: str | dict[str, str] = "") -> pa.Table:
        """Session-local half: facts of the kept turns with raw concept labels (FACT_DRAFTS)."""
        cfg = ctx.config.facts
        raw = [f for turn in parsed_turns(ctx)
               for f in facts_of_turn(turn, cfg.min_content_words, cfg.max_concepts_per_turn)]
        return draft_table(raw, session_key)

    def finish(self, drafts: pa.Table, ctx: ExtractionContext) -> ExtractResult:
        return finish_drafts(drafts, ctx.config.facts.concept_merge_threshold)

    def run(self, ctx: ExtractionContext) -> ExtractResult:
        return self.finish(self.draft(ctx), ctx)
