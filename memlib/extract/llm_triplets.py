"""LLM triplets + entities (MemORAI): ``subject|relation|object`` with turn provenance and
entity descriptions citing their turns."""
from __future__ import annotations

from typing import Any

from memlib.config import Backend
from memlib.extract.base import Extraction, ExtractionContext, ExtractResult, register
from memlib.extract.entities import entity_id, entity_key
from memlib.extract.llm_common import Unit, run_stage
from memlib.extract.rows import NodeRow, TripletAttributes, derived_from, mentions, triplet_id
from memlib.extract.tables import edge_table, node_table
from memlib.llm.models import Task, TripletsOut
from memlib.schema import EdgeKind, NodeKind


def _entity_rows(unit: Unit, out: TripletsOut) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes, edges = [], []
    for ent in out.entities:
        if not entity_key(ent.name):
            continue
        eid = entity_id(unit.tenant_id, ent.name)
        prov = unit.turns_at(ent.turns)
        text = f"{ent.name}: {ent.description}" if ent.description else ent.name
        nodes.append({"node_id": eid, "tenant_id": unit.tenant_id, "conversation_id": unit.conversation_id,
                      "kind": NodeKind.ENTITY.value, "text": text, "time": unit.session_time,
                      "session_id": unit.session_id, "provenance": prov,
                      "attributes": {"name": ent.name, "type": ent.type, "description": ent.description}})
        edges += [{"tenant_id": unit.tenant_id, "src": t, "dst": eid, "kind": EdgeKind.MENTIONS,
                   "provenance": [t]} for t in prov]
    return nodes, edges


def _ensure_entity(unit: Unit, name: str, known: set[str], nodes: list[dict[str, Any]]) -> str:
    eid = entity_id(unit.tenant_id, name)
    if eid not in known:
        known.add(eid)
        nodes.append({"node_id": eid, "tenant_id": unit.tenant_id, "conversation_id": unit.conversation_id,
                      "kind": NodeKind.ENTITY.value, "text": name, "time": unit.session_time,
                      "session_id": unit.session_id, "provenance": [], "attributes": {"name": name}})
    return eid


def convert(unit: Unit, out: TripletsOut, model: str) -> ExtractResult:
    nodes, edges = _entity_rows(unit, out)
    known = {n["node_id"] for n in nodes}
    for tr in out.triplets:
        prov = unit.turns_at(tr.turns)
        if not prov or not entity_key(tr.s) or not entity_key(tr.o):
            continue
        rel = " ".join(tr.r.lower().split())
        nid = triplet_id(unit.tenant_id, prov[0], tr.s, rel, tr.o)
        nodes.append(NodeRow(NodeKind.TRIPLET, nid, unit.tenant_id, f"{tr.s} {rel} {tr.o}", prov,
                             TripletAttributes(subject=tr.s, relation=rel, object=tr.o),
                             conversation_id=unit.conversation_id, session_id=unit.session_id,
                             time=unit.session_time).row())
        s_id = _ensure_entity(unit, tr.s, known, nodes)
        o_id = _ensure_entity(unit, tr.o, known, nodes)
        edges += derived_from(unit.tenant_id, nid, prov)
        edges += mentions(unit.tenant_id, nid, (s_id, o_id), prov)
        if s_id != o_id:
            edges.append({"tenant_id": unit.tenant_id, "src": s_id, "dst": o_id, "kind": EdgeKind.RELATION,
                          "relation": rel, "provenance": prov})
    return ExtractResult(node_table(nodes), edge_table(edges))


def variables(u: Unit) -> dict[str, str]:
    return {"turns": u.lines, "session_date": u.session_date}


@register
class LLMTriplets:
    name = Extraction.TRIPLETS
    backend = Backend.LLM

    def run(self, ctx: ExtractionContext) -> ExtractResult:
        return run_stage(ctx, Extraction.TRIPLETS, Task.TRIPLETS, variables, convert)
