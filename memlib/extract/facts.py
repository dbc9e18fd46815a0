"""GAAMA facts + concepts from kept turns (heuristic backend).

Each declarative, non-phatic sentence of a kept turn becomes a fact with the speaker
named in place of first person and relative dates made explicit. Concepts come from the
sentence's noun chunks and are canonicalized per tenant.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import polars as pl

from memlib.config import Backend
from memlib.extract.base import ExtractionContext, ExtractResult, Stage, register
from memlib.extract.concepts import canonicalize, concept_labels
from memlib.extract.entities import ENTITY_LABELS
from memlib.extract.events import pick_event_time
from memlib.extract.parse import ParsedTurn, parsed_turns
from memlib.extract.person import rewrite_speaker
from memlib.extract.tables import edge_table, node_table
from memlib.ids import make_id
from memlib.schema import EdgeKind, NodeKind
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
        return make_id(NodeKind.FACT, t.tenant_id, t.node_id, self.index, self.text)


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


def _sentence_fact(turn: ParsedTurn, index: int, sent: Any, limit: int) -> RawFact:
    rw = rewrite_speaker(sent, turn.speaker, turn.other_speaker)
    mentions = resolve_dates(rw.text, turn.session_time) if turn.session_time else []
    text = rewrite_relative(rw.text, turn.session_time, mentions) if mentions else rw.text
    ents = [e.text for e in sent.ents if e.label_ in ENTITY_LABELS]
    entities = list(dict.fromkeys(rw.people + ents))
    names = _names(turn) | {w.lower() for e in sent.ents if e.label_ == "PERSON" for w in e.text.split()}
    return RawFact(turn, index, text[:_MAX_FACT_CHARS], pick_event_time(mentions, turn.session_time),
                   bool(mentions), [m.to_json() for m in mentions], entities,
                   concept_labels(sent, names, limit))


def facts_of_turn(turn: ParsedTurn, min_content: int, limit: int) -> list[RawFact]:
    out = []
    for i, sent in enumerate(turn.doc.sents):
        if is_question(sent) or is_imperative(sent) or is_phatic(sent, min_content):
            continue
        out.append(_sentence_fact(turn, i, sent, limit))
    if turn.caption and turn.speaker:
        text = f"{turn.speaker} shared an image: {turn.caption}"
        out.append(RawFact(turn, len(out) + 1000, text[:_MAX_FACT_CHARS], turn.session_time, False, [],
                           [turn.speaker]))
    return out


def _fact_row(f: RawFact, concepts: list[tuple[str, str]]) -> dict[str, Any]:
    t = f.turn
    return {
        "node_id": f.node_id, "tenant_id": t.tenant_id, "conversation_id": t.conversation_id,
        "kind": NodeKind.FACT.value, "text": f.text, "time": f.time, "valid_from": f.time,
        "session_id": t.session_id, "belief": 1.0, "provenance": [t.node_id],
        "attributes": {"speaker": t.speaker, "turn_id": t.turn_id, "dates_mentioned": f.dates,
                       "dated_by_mention": f.dated_by_mention, "entities": f.entities,
                       "topic": concepts[0][1].replace("_", " ") if concepts else None,
                       "concepts": [c for _, c in concepts], "concept_ids": [i for i, _ in concepts]},
    }


def _concept_rows(links: pl.DataFrame) -> list[dict[str, Any]]:
    grouped = (links.group_by(["tenant_id", "concept_id"], maintain_order=True)
               .agg(pl.col("canonical").first(), pl.col("label").unique().sort().alias("aliases"),
                    pl.col("turn").unique().sort().alias("turns"), pl.col("fact").n_unique().alias("n_facts")))
    return [{"node_id": r["concept_id"], "tenant_id": r["tenant_id"], "kind": NodeKind.CONCEPT.value,
             "text": r["canonical"].replace("_", " "), "provenance": r["turns"],
             "attributes": {"label": r["canonical"], "aliases": r["aliases"], "n_facts": r["n_facts"]}}
            for r in grouped.iter_rows(named=True)]


def _link_rows(links: pl.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for r in links.iter_rows(named=True):
        prov = [r["turn"]]
        rows.append({"tenant_id": r["tenant_id"], "src": r["turn"], "dst": r["concept_id"],
                     "kind": EdgeKind.HAS_CONCEPT, "provenance": prov})
        rows.append({"tenant_id": r["tenant_id"], "src": r["fact"], "dst": r["concept_id"],
                     "kind": EdgeKind.ABOUT_CONCEPT, "provenance": prov})
    return rows


def build_result(raw: list[RawFact], threshold: float) -> ExtractResult:
    occ = pl.DataFrame(
        [(f.turn.tenant_id, f.node_id, f.turn.node_id, lab) for f in raw for lab in f.labels],
        schema={"tenant_id": pl.Utf8, "fact": pl.Utf8, "turn": pl.Utf8, "label": pl.Utf8}, orient="row")
    links = occ.join(canonicalize(occ.select(["tenant_id", "label"]), threshold), on=["tenant_id", "label"])
    links = links.unique(["fact", "concept_id"], keep="first", maintain_order=True)
    per_fact: dict[str, list[tuple[str, str]]] = {}
    for fid, cid, canon in links.select(["fact", "concept_id", "canonical"]).iter_rows():
        per_fact.setdefault(fid, []).append((cid, canon))
    facts = [_fact_row(f, per_fact.get(f.node_id, [])) for f in raw]
    derived = [{"tenant_id": f.turn.tenant_id, "src": f.node_id, "dst": f.turn.node_id,
                "kind": EdgeKind.DERIVED_FROM, "provenance": [f.turn.node_id]} for f in raw]
    nodes = node_table(facts + _concept_rows(links))
    return ExtractResult(nodes, edge_table(derived + _link_rows(links)))


@register
class HeuristicFacts:
    name = Stage.FACTS
    backend = Backend.HEURISTIC

    def run(self, ctx: ExtractionContext) -> ExtractResult:
        cfg = ctx.config.facts
        raw = [f for turn in parsed_turns(ctx)
               for f in facts_of_turn(turn, cfg.min_content_words, cfg.max_concepts_per_turn)]
        return build_result(raw, cfg.concept_merge_threshold)
