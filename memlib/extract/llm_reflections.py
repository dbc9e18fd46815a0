"""LLM reflections (GAAMA): higher-level insights over a conversation's facts, each linked to
the facts it rests on (DERIVED_FROM_FACT) and carrying their turn provenance."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memlib.config import Backend
from memlib.extract.base import Extraction, ExtractionContext, ExtractResult, get_extractor, register
from memlib.extract.llm_common import call_units, client_of, handles_of, mark_source, numbered
from memlib.extract.rows import NodeRow, ReflectionAttributes, normalized, reflection_id
from memlib.extract.tables import edge_table, node_table
from memlib.ids import make_id
from memlib.llm.models import ReflectionsOut, Task
from memlib.schema import EdgeKind, NodeKind, Source

FACTS_PER_CALL = 40
FACT_CHARS = 160


@dataclass(frozen=True)
class FactBatch:
    unit_id: str
    tenant_id: str
    conversation_id: str
    facts: list[dict[str, Any]]


def batches(facts: pa.Table) -> list[FactBatch]:
    df = (pl.from_arrow(facts.select(["node_id", "tenant_id", "conversation_id", "kind", "text", "time",
                                      "provenance"]))
          .filter(pl.col("kind") == NodeKind.FACT.value).sort(["tenant_id", "conversation_id", "time"]))
    out = []
    for (tenant, conv), grp in df.group_by(["tenant_id", "conversation_id"], maintain_order=True):
        rows = grp.to_dicts()
        for i in range(0, len(rows), FACTS_PER_CALL):
            chunk = rows[i:i + FACTS_PER_CALL]
            if len(chunk) >= 2:
                uid = make_id("llmunit", Task.REFLECTIONS.value, tenant, *(r["node_id"] for r in chunk))
                out.append(FactBatch(uid, tenant, conv, chunk))
    return out


def variables(b: FactBatch) -> dict[str, str]:
    return {"facts": numbered([r["text"][:FACT_CHARS] for r in b.facts]), "existing_reflections": "(none)"}


def convert(b: FactBatch, out: ReflectionsOut) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes, edges = [], []
    for ref in out.reflections:
        used = [b.facts[i] for i in dict.fromkeys(ref.facts) if 0 <= i < len(b.facts)]
        if not used:
            continue
        rid = reflection_id(b.tenant_id, b.conversation_id, normalized(ref.text))
        prov = sorted({t for f in used for t in (f["provenance"] or [])})
        nodes.append(NodeRow(NodeKind.REFLECTION, rid, b.tenant_id, ref.text, prov,
                             ReflectionAttributes(facts=[f["node_id"] for f in used]),
                             conversation_id=b.conversation_id, time=max(f["time"] for f in used)).row())
        edges += [{"tenant_id": b.tenant_id, "src": rid, "dst": f["node_id"], "kind": EdgeKind.DERIVED_FROM_FACT,
                   "provenance": f["provenance"] or []} for f in used]
    return nodes, edges


def _fallback(ctx: ExtractionContext, failed: list[FactBatch]) -> ExtractResult:
    if not failed:
        return ExtractResult()
    ids = pa.array(sorted({f["node_id"] for b in failed for f in b.facts}), pa.string())
    sub = ExtractionContext(turns=ctx.turns, config=ctx.config, nlp=ctx.nlp, extras=handles_of(ctx),
                            facts=ctx.facts.filter(pc.is_in(ctx.facts.column("node_id"), value_set=ids)))
    res = get_extractor(Extraction.REFLECTIONS, Backend.HEURISTIC).run(sub).conformed("reflections.fallback")
    return ExtractResult(mark_source(res.nodes, Source.HEURISTIC_FALLBACK.value), res.edges)


@register
class LLMReflections:
    name = Extraction.REFLECTIONS
    backend = Backend.LLM

    def run(self, ctx: ExtractionContext) -> ExtractResult:
        if not ctx.config.reflections.enabled or ctx.facts is None or ctx.facts.num_rows == 0:
            return ExtractResult()
        todo = batches(ctx.facts)
        calls = call_units(client_of(ctx), Task.REFLECTIONS, todo, variables, ctx.config.llm.concurrency)
        parts, failed = [], []
        for b, call in zip(todo, calls):
            if not call.ok:
                failed.append(b)
                continue
            nodes, edges = convert(b, call.output)
            part = ExtractResult(node_table(nodes), edge_table(edges)).conformed("reflections")
            parts.append(ExtractResult(mark_source(part.nodes, ctx.config.llm.model, call.prompt_version),
                                       part.edges))
        parts.append(_fallback(ctx, failed))
        return ExtractResult.concat(parts)
