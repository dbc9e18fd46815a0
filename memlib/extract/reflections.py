"""GAAMA reflections (heuristic backend): recurring (speaker, concept) themes per tenant.

A reflection is written for every (tenant, speaker, concept) with at least ``min_facts``
facts spanning at least ``min_sessions`` sessions, e.g. "Caroline repeatedly talks about
pottery class (4 facts, May–Aug 2023)". It links to its facts (DERIVED_FROM_FACT) and to
the concept (ABOUT_CONCEPT); provenance is the union of those facts' turns.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.config import Backend
from memlib.extract.base import Extraction, ExtractionContext, ExtractResult, register
from memlib.extract.rows import NodeRow, ReflectionAttributes, reflection_id
from memlib.extract.tables import edge_table, node_table
from memlib.schema import EdgeKind, NodeKind


def span_label(start: datetime | None, end: datetime | None) -> str:
    """'May–Aug 2023', 'Dec 2022–Feb 2023', 'May 2023' or '' for unknown times."""
    if start is None or end is None:
        return ""
    if (start.year, start.month) == (end.year, end.month):
        return f"{start:%b %Y}"
    if start.year == end.year:
        return f"{start:%b}–{end:%b %Y}"
    return f"{start:%b %Y}–{end:%b %Y}"


def _fact_concepts(facts: Any) -> pl.DataFrame:
    attrs = pl.col("attributes")
    return (pl.from_arrow(facts.select(["node_id", "tenant_id", "kind", "session_id", "time", "provenance",
                                        "attributes"]))
            .filter(pl.col("kind") == NodeKind.FACT.value)
            .with_columns(attrs.str.json_path_match("$.speaker").alias("speaker"),
                          attrs.str.json_path_match("$.concept_ids").fill_null("[]")
                          .str.json_decode(pl.List(pl.Utf8)).alias("concept_id"),
                          attrs.str.json_path_match("$.concepts").fill_null("[]")
                          .str.json_decode(pl.List(pl.Utf8)).alias("concept"))
            .drop_nulls("speaker")
            .explode(["concept_id", "concept"]).drop_nulls("concept_id"))


def _fact_sessions(nodes: pa.Table) -> int:
    """Distinct session ids (null one of them) of the facts among ``nodes``: no theme spans more."""
    facts = nodes.filter(pc.equal(nodes.column("kind"), NodeKind.FACT.value))
    return pc.count_distinct(facts.column("session_id"), mode="all").as_py()


def themes(facts: Any, min_facts: int, min_sessions: int) -> pl.DataFrame:
    """One row per qualifying (tenant, speaker, concept) with its facts, turns and time span."""
    return (_fact_concepts(facts)
            .sort(["tenant_id", "speaker", "concept_id", "time", "node_id"])
            .group_by(["tenant_id", "speaker", "concept_id"], maintain_order=True)
            .agg(pl.col("concept").first(), pl.col("node_id").alias("facts"),
                 pl.col("provenance").list.explode(keep_nulls=False, empty_as_null=False)
                 .unique().sort().alias("turns"),
                 pl.col("session_id").n_unique().alias("sessions"),
                 pl.col("time").min().alias("start"), pl.col("time").max().alias("end"))
            .filter((pl.col("facts").list.len() >= min_facts) & (pl.col("sessions") >= min_sessions)))


def _rows(theme: dict[str, Any]) -> dict[str, Any]:
    t, n = theme["tenant_id"], len(theme["facts"])
    rid = reflection_id(t, theme["speaker"], theme["concept_id"])
    when = span_label(theme["start"], theme["end"])
    label = theme["concept"].replace("_", " ")
    text = f"{theme['speaker']} repeatedly talks about {label} ({n} facts" + (f", {when})" if when else ")")
    attrs = ReflectionAttributes(facts=list(theme["facts"]), speaker=theme["speaker"], concept=theme["concept"],
                                 concept_id=theme["concept_id"], n_facts=n, sessions=theme["sessions"])
    return NodeRow(NodeKind.REFLECTION, rid, t, text, theme["turns"], attrs, time=theme["end"],
                   valid_from=theme["start"]).row()


def _edge_rows(theme: dict[str, Any], rid: str) -> list[dict[str, Any]]:
    t = theme["tenant_id"]
    edges = [{"tenant_id": t, "src": rid, "dst": f, "kind": EdgeKind.DERIVED_FROM_FACT, "provenance": theme["turns"]}
             for f in theme["facts"]]
    edges.append({"tenant_id": t, "src": rid, "dst": theme["concept_id"], "kind": EdgeKind.ABOUT_CONCEPT,
                  "provenance": theme["turns"]})
    return edges


def _edges(themes: list[dict[str, Any]], rids: list[str]) -> pa.Table:
    """DERIVED_FROM_FACT (reflection -> each of its facts) and ABOUT_CONCEPT (reflection -> its
    concept) edges, as :func:`memlib.extract.tables.edge_table` makes them from :func:`_edge_rows`
    (in that order, a repeated fact once, the theme's turns as provenance, sorted, without nulls),
    built in columns: a reflection's edges share one provenance list (16k edges of 2.6k reflections
    in a 2,500-session tenant were as many dicts). Reflection ids are distinct (one per theme);
    were two the same, the rows are merged by ``edge_table``."""
    if len(set(rids)) != len(rids):
        return edge_table([e for theme, rid in zip(themes, rids) for e in _edge_rows(theme, rid)])
    tenant, src, dst, kind, values, offsets = [], [], [], [], [], [0]
    for theme, rid in zip(themes, rids):
        dsts = [*dict.fromkeys(theme["facts"]), theme["concept_id"]]
        turns = sorted({p for p in theme["turns"] or () if p is not None})
        for _ in dsts:
            values += turns
            offsets.append(len(values))
        tenant += [theme["tenant_id"]] * len(dsts)
        src += [rid] * len(dsts)
        dst += dsts
        kind += [EdgeKind.DERIVED_FROM_FACT.value] * (len(dsts) - 1) + [EdgeKind.ABOUT_CONCEPT.value]
    n = len(src)
    if n == 0:
        return schema.empty(schema.EDGES)
    table = pa.table({"tenant_id": pa.array(tenant, pa.string()), "src": pa.array(src, pa.string()),
                      "dst": pa.array(dst, pa.string()), "kind": pa.array(kind, pa.string()),
                      "weight": pa.array(np.ones(n, np.float32), pa.float32()),
                      "relation": pa.nulls(n, pa.string()),
                      "provenance": pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                                             pa.array(values, pa.string()))})
    return schema.conform(table, schema.EDGES, name="edges")


@register
class HeuristicReflections:
    name = Extraction.REFLECTIONS
    backend = Backend.HEURISTIC

    def run(self, ctx: ExtractionContext) -> ExtractResult:
        cfg = ctx.config.reflections
        if not cfg.enabled or ctx.facts is None or _fact_sessions(ctx.facts) < cfg.min_sessions:
            return ExtractResult()
        rows = list(themes(ctx.facts, cfg.min_facts, cfg.min_sessions).iter_rows(named=True))
        nodes = [_rows(theme) for theme in rows]
        return ExtractResult(node_table(nodes), _edges(rows, [node["node_id"] for node in nodes]))
