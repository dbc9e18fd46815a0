"""The heuristic reflections' edges, built in columns, equal what ``edge_table`` made of one dict per
edge: a fact repeated in a theme once, the theme's turns as provenance (sorted, no null), in order."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pyarrow as pa

from memlib import schema
from memlib.config import MemlibConfig
from memlib.extract.base import ExtractionContext
from memlib.extract.reflections import HeuristicReflections, themes
from memlib.extract.rows import reflection_id
from memlib.extract.tables import edge_table
from memlib.schema import EdgeKind

T0 = datetime(2023, 5, 1, tzinfo=timezone.utc)


def _facts() -> pa.Table:
    rows = []
    for i in range(12):
        speaker = ["Ann", "Bob"][i % 2]
        concepts = ["pottery", "pottery"] if i == 4 else ["pottery", "running"] if i % 3 else ["running"]
        provenance = [f"t{i}", f"t{(i * 7) % 5}", None] if i == 6 else [f"t{i}", f"t{(i * 7) % 5}"]
        rows.append({"node_id": f"fact{i:02d}", "tenant_id": "x", "kind": "fact", "text": f"fact {i}",
                     "session_id": f"s{i % 4}", "time": T0 + timedelta(days=10 * i), "provenance": provenance,
                     "attributes": json.dumps({"speaker": speaker, "concepts": concepts,
                                               "concept_ids": [f"concept:{c}" for c in concepts]})})
    return schema.conform(pa.Table.from_pylist(rows), schema.NODES_NO_EMBEDDING, name="facts")


def _reference(facts: pa.Table, cfg) -> pa.Table:
    """One dict per edge through ``edge_table`` (the code before the columns)."""
    rows = []
    for theme in themes(facts, cfg.min_facts, cfg.min_sessions).iter_rows(named=True):
        rid = reflection_id(theme["tenant_id"], theme["speaker"], theme["concept_id"])
        rows += [{"tenant_id": "x", "src": rid, "dst": f, "kind": EdgeKind.DERIVED_FROM_FACT,
                  "provenance": theme["turns"]} for f in theme["facts"]]
        rows.append({"tenant_id": "x", "src": rid, "dst": theme["concept_id"], "kind": EdgeKind.ABOUT_CONCEPT,
                     "provenance": theme["turns"]})
    return edge_table(rows)


def test_reflection_edges_equal_the_edges_of_one_dict_each():
    cfg = MemlibConfig()
    facts = _facts()
    turns = schema.empty(schema.TURNS)
    got = HeuristicReflections().run(ExtractionContext(turns=turns, config=cfg, facts=facts)).edges
    want = _reference(facts, cfg.reflections)
    assert want.num_rows > 8 and got.combine_chunks().equals(want.combine_chunks())
    assert got.schema.equals(want.schema)
