"""Subject-relation-object triplets and entities from spaCy dependency parses (heuristic backend).

Per verb: subjects (nsubj/nsubjpass, conjuncts included, inherited by conjoined verbs),
relation = verb lemma (+ particle) (+ preposition), objects = dobj/attr/oprd or the pobj of
a prepositional child. First person maps to the speaker, second person to the other
speaker of a two-party conversation; other pronouns are skipped (unresolved). Entities
(NER + speakers) get descriptions from the sentences that mention them, citing turn ids;
a triplet whose ends are both entities also yields a labelled RELATION edge.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from memlib.config import Backend
from memlib.extract.base import ExtractionContext, ExtractResult, Stage, register
from memlib.extract.entities import ENTITY_LABELS, EntityIndex, entity_key
from memlib.extract.parse import ParsedTurn, parsed_turns
from memlib.extract.person import rewrite_speaker
from memlib.extract.tables import edge_table, node_table
from memlib.ids import make_id
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


def _entity_id_for(tok: Any, text: str, turn: ParsedTurn, index: EntityIndex) -> str | None:
    if tok.lower_ in _SELF | _YOU or _entity_span(tok) is not None:
        return index.lookup(turn.tenant_id, text)
    return None


def _turn_entities(turn: ParsedTurn, index: EntityIndex, edges: list[dict[str, Any]]) -> None:
    if turn.speaker:
        index.add(turn.tenant_id, turn.speaker, "PERSON", None)
    if turn.other_speaker:
        index.add(turn.tenant_id, turn.other_speaker, "PERSON", None)
    for sent in turn.doc.sents:
        ents = [e for e in sent.ents if e.label_ in ENTITY_LABELS]
        if not ents:
            continue
        said = rewrite_speaker(sent, turn.speaker, turn.other_speaker).text
        for e in ents:
            eid = index.add(turn.tenant_id, e.text, e.label_, (turn.node_id, turn.turn_id, said))
            if eid:
                edges.append({"tenant_id": turn.tenant_id, "src": turn.node_id, "dst": eid,
                              "kind": EdgeKind.MENTIONS, "provenance": [turn.node_id]})


def _triplet_rows(turn: ParsedTurn, index: EntityIndex, nodes: list, edges: list) -> None:
    for sent in turn.doc.sents:
        for tr in sentence_triplets(sent, turn):
            nid = make_id(NodeKind.TRIPLET, turn.tenant_id, turn.node_id, tr.subject, tr.relation, tr.obj)
            prov = [turn.node_id]
            nodes.append({"node_id": nid, "tenant_id": turn.tenant_id, "conversation_id": turn.conversation_id,
                          "kind": NodeKind.TRIPLET.value, "text": tr.text, "time": turn.session_time,
                          "session_id": turn.session_id, "provenance": prov,
                          "attributes": {"subject": tr.subject, "relation": tr.relation, "object": tr.obj,
                                         "turn_id": turn.turn_id, "speaker": turn.speaker}})
            edges.append({"tenant_id": turn.tenant_id, "src": nid, "dst": turn.node_id,
                          "kind": EdgeKind.DERIVED_FROM, "provenance": prov})
            s_id = _entity_id_for(tr.subj_tok, tr.subject, turn, index)
            o_id = _entity_id_for(tr.obj_tok, tr.obj, turn, index)
            for eid in {s_id, o_id} - {None}:
                edges.append({"tenant_id": turn.tenant_id, "src": nid, "dst": eid,
                              "kind": EdgeKind.MENTIONS, "provenance": prov})
            if s_id and o_id and s_id != o_id:
                edges.append({"tenant_id": turn.tenant_id, "src": s_id, "dst": o_id, "kind": EdgeKind.RELATION,
                              "relation": tr.relation, "provenance": prov})


def _fact_mentions(facts: Any, index: EntityIndex) -> list[dict[str, Any]]:
    """MENTIONS fact->entity for the entity names recorded in each fact's attributes."""
    if facts is None or facts.num_rows == 0 or not index.items:
        return []
    known = pl.DataFrame([(t, k, acc.node_id) for (t, k), acc in index.items.items()],
                         schema={"tenant_id": pl.Utf8, "key": pl.Utf8, "dst": pl.Utf8}, orient="row")
    df = (pl.from_arrow(facts.select(["node_id", "tenant_id", "kind", "provenance", "attributes"]))
          .filter(pl.col("kind") == NodeKind.FACT.value)
          .with_columns(pl.col("attributes").str.json_path_match("$.entities").fill_null("[]")
                        .str.json_decode(pl.List(pl.Utf8)).alias("name"))
          .explode("name").drop_nulls("name")
          .with_columns(pl.col("name").map_elements(entity_key, return_dtype=pl.Utf8).alias("key"))
          .join(known, on=["tenant_id", "key"])
          .select(["tenant_id", pl.col("node_id").alias("src"), "dst", "provenance"])
          .with_columns(pl.lit(EdgeKind.MENTIONS.value).alias("kind")))
    return df.to_dicts()


@register
class HeuristicTriplets:
    name = Stage.TRIPLETS
    backend = Backend.HEURISTIC

    def run(self, ctx: ExtractionContext) -> ExtractResult:
        index = EntityIndex()
        nodes: list[dict[str, Any]] = []
        edges: list[dict[str, Any]] = []
        turns = parsed_turns(ctx)
        for turn in turns:
            _turn_entities(turn, index, edges)
        for turn in turns:
            _triplet_rows(turn, index, nodes, edges)
        edges += _fact_mentions(ctx.facts, index)
        nodes += index.rows(ctx.config.triplets.description_chars)
        return ExtractResult(node_table(nodes), edge_table(edges))
