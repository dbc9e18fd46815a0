"""Subject-relation-object triplets and entities from spaCy dependency parses (heuristic backend).

Per verb: subjects (nsubj/nsubjpass, conjuncts included, inherited by conjoined verbs),
relation = verb lemma (+ particle) (+ preposition), objects = dobj/attr/oprd or the pobj of
a prepositional child. First person maps to the speaker, second person to the other
speaker of a two-party conversation; other pronouns are skipped (unresolved). Entities
(NER + speakers) get descriptions from the sentences that mention them, citing turn ids;
a triplet whose ends are both entities also yields a labelled RELATION edge.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.config import Backend
from memlib.extract.base import Extraction, ExtractionContext, ExtractResult, register
from memlib.extract.entities import ENTITY_LABELS, EntityIndex, entity_key
from memlib.extract.parse import ParsedTurn, parsed_turns
from memlib.extract.person import rewrite_speaker
from memlib.extract.rows import triplet_id
from memlib.extract.tables import edge_table, node_table
from memlib.ids import session_node_id
from memlib.schema import EdgeKind, NodeKind

_SUBJ = ("nsubj", "nsubjpass")
_OBJ = ("dobj", "attr", "oprd")
_VERB_DEPS = ("ROOT", "conj", "ccomp", "xcomp", "advcl", "relcl")
_SELF = {"i", "me", "myself"}
_YOU = {"you", "yourself"}
_KEEP_MODS = ("compound", "amod", "poss", "nummod", "nmod")


@dataclass(frozen=True)
class Triplet:
    subject: str
    relation: str
    obj: str
    subj_tok: Any
    obj_tok: Any

    @property
    def text(self) -> str:
        return f"{self.subject} {self.relation} {self.obj}"


def _entity_span(tok: Any) -> Any:
    for ent in tok.doc.ents:
        if ent.start <= tok.i < ent.end and ent.label_ in ENTITY_LABELS:
            return ent
    return None


def phrase(tok: Any, turn: ParsedTurn) -> str | None:
    """Surface phrase for a subject/object token, or None when it cannot be resolved."""
    low = tok.lower_
    if low in _SELF:
        return turn.speaker
    if low in _YOU:
        return turn.other_speaker
    if tok.pos_ == "PRON" or tok.is_stop:
        return None
    ent = _entity_span(tok)
    if ent is not None:
        return ent.text
    parts = []
    for t in sorted([c for c in tok.children if c.dep_ in _KEEP_MODS] + [tok], key=lambda t: t.i):
        if t.lower_ in ("my", "mine"):
            parts.append(f"{turn.speaker}'s" if turn.speaker else t.text)
        elif t.lower_ in ("your", "yours") and turn.other_speaker:
            parts.append(f"{turn.other_speaker}'s")
        elif not (t.pos_ == "PRON" and t is not tok):
            parts.append(t.text)
    return " ".join(parts)


def _subjects(verb: Any) -> list[Any]:
    subs = [c for c in verb.children if c.dep_ in _SUBJ]
    if not subs and verb.dep_ in ("conj", "xcomp") and verb.head.pos_ in ("VERB", "AUX"):
        subs = [c for c in verb.head.children if c.dep_ in _SUBJ]
    return subs + [c for s in subs for c in s.conjuncts]


def _objects(verb: Any) -> list[tuple[str, Any]]:
    prt = " ".join(c.lower_ for c in verb.children if c.dep_ == "prt")
    base = " ".join(p for p in (verb.lemma_.lower(), prt) if p)
    out = [(base, c) for c in verb.children if c.dep_ in _OBJ]
    for prep in (c for c in verb.children if c.dep_ == "prep"):
        out += [(f"{base} {prep.lower_}", p) for p in prep.children if p.dep_ == "pobj"]
    return out + [(rel, c) for rel, o in list(out) for c in o.conjuncts]


def sentence_triplets(sent: Any, turn: ParsedTurn) -> list[Triplet]:
    out = []
    for verb in sent:
        if verb.pos_ not in ("VERB", "AUX") or verb.dep_ not in _VERB_DEPS:
            continue
        objs = _objects(verb)
        for s in _subjects(verb):
            sp = phrase(s, turn)
            for rel, o in objs:
                op = phrase(o, turn) if sp else None
                if sp and op and sp != op:
                    out.append(Triplet(sp, rel, op, s, o))
    return out


def _eligible(tok: Any) -> bool:
    """Whether a triplet end names something an entity can stand for (a person pronoun or an entity span)."""
    return tok.lower_ in _SELF | _YOU or _entity_span(tok) is not None


def _key_of(turn: ParsedTurn, key: str | dict[str, str]) -> str:
    return key if isinstance(key, str) else key[session_node_id(turn.tenant_id, turn.conversation_id,
                                                                 turn.session_id)]


def _turn_mentions(turn: ParsedTurn, key: str, out: list[dict[str, Any]]) -> None:
    """ENTITY_MENTIONS rows of one turn, in the order the entity index takes them."""
    for who in (turn.speaker, turn.other_speaker):
        if who:
            out.append({"session_key": key, "tenant_id": turn.tenant_id, "name": who, "label": "PERSON"})
    for sent in turn.doc.sents:
        ents = [e for e in sent.ents if e.label_ in ENTITY_LABELS]
        if not ents:
            continue
        said = rewrite_speaker(sent, turn.speaker, turn.other_speaker).text
        for e in ents:
            out.append({"session_key": key, "tenant_id": turn.tenant_id, "name": e.text, "label": e.label_,
                        "turn_node_id": turn.node_id, "turn_id": turn.turn_id, "sentence": said})


def _turn_triplets(turn: ParsedTurn, key: str, out: list[dict[str, Any]]) -> None:
    for sent in turn.doc.sents:
        for tr in sentence_triplets(sent, turn):
            out.append({"session_key": key,
                        "node_id": triplet_id(turn.tenant_id, turn.node_id, tr.subject, tr.relation, tr.obj),
                        "tenant_id": turn.tenant_id, "conversation_id": turn.conversation_id,
                        "session_id": turn.session_id, "time": turn.session_time, "text": tr.text,
                        "subject": tr.subject, "relation": tr.relation, "object": tr.obj,
                        "turn_node_id": turn.node_id, "turn_id": turn.turn_id, "speaker": turn.speaker,
                        "subject_entity": tr.subject if _eligible(tr.subj_tok) else None,
                        "object_entity": tr.obj if _eligible(tr.obj_tok) else None})


def drafts(turns: list[ParsedTurn], session_key: str | dict[str, str] = "") -> tuple[pa.Table, pa.Table]:
    """Session-local half of the triplets stage: (ENTITY_MENTIONS, TRIPLET_DRAFTS) of parsed turns."""
    mentions: list[dict[str, Any]] = []
    triplets: list[dict[str, Any]] = []
    for turn in turns:
        key = _key_of(turn, session_key)
        _turn_mentions(turn, key, mentions)
        _turn_triplets(turn, key, triplets)
    return (pa.Table.from_pylist(mentions, schema=schema.ENTITY_MENTIONS) if mentions
            else schema.empty(schema.ENTITY_MENTIONS),
            pa.Table.from_pylist(triplets, schema=schema.TRIPLET_DRAFTS) if triplets
            else schema.empty(schema.TRIPLET_DRAFTS))


def _index_mentions(mentions: pa.Table, index: EntityIndex, edges: list[dict[str, Any]]) -> None:
    for m in mentions.to_pylist():
        cite = (m["turn_node_id"], m["turn_id"], m["sentence"]) if m["turn_node_id"] is not None else None
        eid = index.add(m["tenant_id"], m["name"], m["label"], cite)
        if eid and cite is not None:
            edges.append({"tenant_id": m["tenant_id"], "src": m["turn_node_id"], "dst": eid,
                          "kind": EdgeKind.MENTIONS, "provenance": [m["turn_node_id"]]})


def triplet_node(t: dict[str, Any]) -> dict[str, Any]:
    """The node row of a TRIPLET_DRAFTS row (for :func:`memlib.extract.tables.node_table`)."""
    return {"node_id": t["node_id"], "tenant_id": t["tenant_id"], "conversation_id": t["conversation_id"],
            "kind": NodeKind.TRIPLET.value, "text": t["text"], "time": t["time"],
            "session_id": t["session_id"], "provenance": [t["turn_node_id"]],
            "attributes": {"subject": t["subject"], "relation": t["relation"], "object": t["object"],
                           "turn_id": t["turn_id"], "speaker": t["speaker"]}}


def _triplet_rows(triplets: pa.Table, index: EntityIndex, nodes: list, edges: list) -> None:
    for t in triplets.to_pylist():
        nid, turn, tenant = t["node_id"], t["turn_node_id"], t["tenant_id"]
        prov = [turn]
        nodes.append(triplet_node(t))
        edges.append({"tenant_id": tenant, "src": nid, "dst": turn, "kind": EdgeKind.DERIVED_FROM,
                      "provenance": prov})
        s_id = index.lookup(tenant, t["subject_entity"]) if t["subject_entity"] is not None else None
        o_id = index.lookup(tenant, t["object_entity"]) if t["object_entity"] is not None else None
        for eid in {s_id, o_id} - {None}:
            edges.append({"tenant_id": tenant, "src": nid, "dst": eid, "kind": EdgeKind.MENTIONS,
                          "provenance": prov})
        if s_id and o_id and s_id != o_id:
            edges.append({"tenant_id": tenant, "src": s_id, "dst": o_id, "kind": EdgeKind.RELATION,
                          "relation": t["relation"], "provenance": prov})


def _fact_mentions(facts: pa.Table | None, index: EntityIndex) -> list[dict[str, Any]]:
    """MENTIONS fact->entity for the entity names recorded in each fact's attributes (in fact and
    name order)."""
    if facts is None or facts.num_rows == 0 or not index.items:
        return []
    facts = facts.filter(pc.equal(facts.column("kind"), NodeKind.FACT.value))
    edges = []
    for f in facts.select(["node_id", "tenant_id", "provenance", "attributes"]).to_pylist():
        for name in _entity_names(f["attributes"]):
            entity = index.items.get((f["tenant_id"], entity_key(name)))
            if entity is not None:
                edges.append({"tenant_id": f["tenant_id"], "src": f["node_id"], "dst": entity.node_id,
                              "provenance": f["provenance"], "kind": EdgeKind.MENTIONS.value})
    return edges


def _entity_names(attributes: str | None) -> list[str]:
    """The non-null names of a fact's ``entities`` attribute."""
    names = json.loads(attributes).get("entities") if attributes else None
    return [n for n in names or () if n is not None]


@register
class HeuristicTriplets:
    name = Extraction.TRIPLETS
    backend = Backend.HEURISTIC

    def draft(self, ctx: ExtractionContext, session_key: str | dict[str, str] = "") -> tuple[pa.Table, pa.Table]:
        return drafts(parsed_turns(ctx), session_key)

    def finish(self, mentions: pa.Table, triplets: pa.Table, ctx: ExtractionContext) -> ExtractResult:
        """Tenant-level half: one entity index over every mention of the tenant (in session and turn
        order), triplet nodes with their entity links, fact mentions, entity nodes."""
        index = EntityIndex()
        nodes: list[dict[str, Any]] = []
        edges: list[dict[str, Any]] = []
        _index_mentions(mentions, index, edges)
        _triplet_rows(triplets, index, nodes, edges)
        edges += _fact_mentions(ctx.facts, index)
        nodes += index.rows(ctx.config.triplets.description_chars)
        return ExtractResult(node_table(nodes), edge_table(edges))

    def run(self, ctx: ExtractionContext) -> ExtractResult:
        return self.finish(*self.draft(ctx), ctx)
