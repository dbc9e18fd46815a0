"""LLM facts + concepts (GAAMA), with outdated-fact detection (PersonalAI).

Each unit's prompt shows the turns, recent existing facts and concepts of the conversation
and the turns just before the unit. After extraction, facts of later sessions are checked
against lexically related facts of earlier sessions; a fact that replaces an old one gets a
SUPERSEDES edge (new -> old) and closes the old fact's ``valid_to``.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import polars as pl

from memlib.config import Backend
from memlib.extract.base import Extraction, ExtractionContext, ExtractResult, register
from memlib.extract.concepts import token_key
from memlib.extract.contract import complete_facts
from memlib.extract.llm_common import Unit, numbered, run_stage
from memlib.extract.llm_outdated import supersede
from memlib.extract.rows import (
    ConceptAttributes,
    NodeRow,
    concept_id,
    concept_links,
    derived_from,
    fact_id,
    normalized,
)
from memlib.extract.tables import edge_table, node_table
from memlib.llm.models import FactsOut, Task
from memlib.schema import NodeKind

EXISTING_FACTS = 8
EXISTING_CONCEPTS = 25


def _existing(ctx: ExtractionContext) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Per conversation: the most recent existing fact texts and concept labels."""
    if ctx.facts is None or ctx.facts.num_rows == 0:
        return {}, {}
    df = pl.from_arrow(ctx.facts.select(["conversation_id", "tenant_id", "kind", "text", "time"]))
    facts = (df.filter(pl.col("kind") == NodeKind.FACT.value).sort("time", nulls_last=False)
             .group_by("conversation_id").agg(pl.col("text").tail(EXISTING_FACTS)))
    concepts = (df.filter(pl.col("kind") == NodeKind.CONCEPT.value)
                .group_by("tenant_id").agg(pl.col("text").head(EXISTING_CONCEPTS)))
    return (dict(zip(facts["conversation_id"], facts["text"])),
            dict(zip(concepts["tenant_id"], concepts["text"])))


def _previous_lines(ctx: ExtractionContext) -> dict[str, str]:
    """unit's first turn node id -> the two turns before it in its session (related episodes)."""
    df = (pl.from_arrow(ctx.turns.select(["conversation_id", "session_id", "session_index", "turn_index",
                                          "node_id", "speaker", "text"]))
          .sort(["conversation_id", "session_index", "turn_index"])
          .with_columns((pl.col("speaker").fill_null("?") + ": " + pl.col("text").str.slice(0, 200))
                        .alias("line")))
    prev = df.with_columns(
        pl.concat_str([pl.col("line").shift(2).over("session_id"), pl.col("line").shift(1).over("session_id")],
                      separator="\n", ignore_nulls=True).alias("prev"))
    return dict(zip(prev["node_id"], prev["prev"]))


def convert(unit: Unit, out: FactsOut, model: str, max_concepts: int = 3) -> ExtractResult:
    """The unit's facts (each with at most ``max_concepts`` concepts, ``facts.max_concepts_per_turn``
    as in the heuristic backend), their concepts and edges; attributes are completed to the fact
    contract afterwards (:func:`complete_facts`)."""
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    t_id = unit.tenant_id
    for index, item in enumerate(out.facts):
        prov = unit.turns_at(item.turns)
        if not prov:
            continue
        fid = fact_id(t_id, prov[0], index, normalized(item.text))
        labels = list(dict.fromkeys(token_key(c) for c in item.concepts if c.strip()))[:max_concepts]
        cids = [concept_id(t_id, lab) for lab in labels]
        attrs = {"concepts": labels, "concept_ids": cids}  # the rest of FactAttributes: complete_facts
        nodes.append(NodeRow(NodeKind.FACT, fid, t_id, item.text, prov, attrs, conversation_id=unit.conversation_id,
                             session_id=unit.session_id, time=unit.session_time, valid_from=unit.session_time,
                             belief=1.0).row())
        edges += derived_from(t_id, fid, prov)
        for cid, lab in zip(cids, labels):
            nodes.append(NodeRow(NodeKind.CONCEPT, cid, t_id, lab.replace("_", " "), prov,
                                 ConceptAttributes(label=lab)).row())
            edges += concept_links(t_id, fid, cid, prov)
    return ExtractResult(node_table(nodes), edge_table(edges))


def variables_for(ctx: ExtractionContext):
    facts, concepts = _existing(ctx)
    prev = _previous_lines(ctx)

    def variables(u: Unit) -> dict[str, str]:
        return {"turns": u.lines, "session_date": u.session_date,
                "existing_facts": numbered(facts.get(u.conversation_id, [])),
                "existing_concepts": ", ".join(c.replace(" ", "_") for c in concepts.get(u.tenant_id, []))
                or "(none)",
                "related_episodes": prev.get(u.turn_node_ids[0]) or "(none)"}
    return variables


@register
class LLMFacts:
    name = Extraction.FACTS
    backend = Backend.LLM

    def run(self, ctx: ExtractionContext) -> ExtractResult:
        limit = partial(convert, max_concepts=ctx.config.facts.max_concepts_per_turn)
        res = supersede(ctx, run_stage(ctx, Extraction.FACTS, Task.FACTS, variables_for(ctx), limit))
        return ExtractResult(complete_facts(res.nodes, ctx.turns), res.edges)  # the heuristic fact contract

