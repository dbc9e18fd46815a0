"""The facts and triplets finishes that reuse a published build (memlib.extract.facts_reuse,
memlib.extract.triplets_reuse) against the full finishes, on small drafts: a label that joins a
cluster, changes its canonical label or bridges two clusters; an entity whose name, label,
description and cites change; a removed session."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from memlib import schema
from memlib.config import MemlibConfig
from memlib.extract.base import ExtractionContext
from memlib.extract.concepts import cluster
from memlib.extract.facts import finish_drafts
from memlib.extract.facts_reuse import finish_reusing as facts_reusing
from memlib.extract.prior import Prior, session_key
from memlib.extract.triplets import HeuristicTriplets
from memlib.extract.triplets_reuse import finish_reusing as triplets_reusing
from memlib.schema import NodeKind

T = 0.5  # low enough for labels of 2-3 words to join (the default 0.9 joins equal token sets only)


def _facts(session: str, labels: list[list[str]], entities: list[list[str]] | None = None) -> list[dict]:
    out = []
    for i, ls in enumerate(labels):
        turn = f"turn:{session}-{i}"
        out.append({"session_key": session, "node_id": f"fact:{session}-{i}", "tenant_id": "t", "conversation_id": "c",
                    "session_id": session, "turn_node_id": turn, "turn_id": f"{session}-{i}", "speaker": "Ann",
                    "text": f"Ann said thing {session} {i}.", "time": None, "dates": "[]", "dated_by_mention": False,
                    "entities": (entities or [[]] * len(labels))[i], "labels": ls})
    return out


def _table(rows: list[dict], s: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=s) if rows else schema.empty(s)


def _prior(published: pa.Table, dirty: set[str], turns: set[str], speakers: set[str] = frozenset(),
           extends: bool = True) -> Prior:
    rows = {k.value: published.filter(pc.equal(published.column("kind"), k.value)) for k in NodeKind}
    return Prior(rows, frozenset(session_key("c", s) for s in dirty), frozenset(turns), frozenset(speakers), extends)


def _edges(t: pa.Table) -> list[tuple]:
    return sorted((r["kind"], r["src"], r["dst"], r["relation"] or "", tuple(r["provenance"]), r["weight"])
                  for r in t.to_pylist())


def _check_facts(before: list[dict], after: list[dict], new_sessions: set[str], extends: bool = True) -> int:
    published = finish_drafts(_table(before, schema.FACT_DRAFTS), T).nodes
    now = _table(after, schema.FACT_DRAFTS)
    full = finish_drafts(now, T)
    turns = {r["turn_node_id"] for r in before + after if r["session_id"] in new_sessions}
    got, copied = facts_reusing(now, T, _prior(published, new_sessions, turns, extends=extends))
    assert got.nodes.equals(schema.conform(full.nodes, schema.NODES_NO_EMBEDDING))
    assert _edges(got.edges) == _edges(full.edges)
    return copied


def _concepts(nodes: pa.Table) -> dict[str, str]:
    c = nodes.filter(pc.equal(nodes.column("kind"), "concept"))
    return dict(zip(c.column("node_id").to_pylist(), c.column("text").to_pylist()))


def test_a_new_label_that_joins_a_cluster():
    before = _facts("s1", [["pottery_class"], ["pottery_class"], ["art_museum"], ["old_car"]])
    after = before + _facts("s2", [["pottery_class_lesson"]])
    copied = _check_facts(before, after, {"s2"})
    assert copied >= 4  # the facts of s1 and the untouched concepts
    full = finish_drafts(_table(after, schema.FACT_DRAFTS), T).nodes
    assert "pottery class" in _concepts(full).values() and "pottery class lesson" not in _concepts(full).values()


def test_a_new_label_that_changes_the_canonical_label_by_frequency():
    before = _facts("s1", [["pottery_class"], ["pottery_class"], ["pottery_class_lesson"], ["art_museum"]])
    after = before + _facts("s2", [["pottery_class_lesson"], ["pottery_class_lesson", "art_museum"]])
    _check_facts(before, after, {"s2"})
    names = _concepts(finish_drafts(_table(after, schema.FACT_DRAFTS), T).nodes).values()
    assert "pottery class lesson" in names and "pottery class" not in names


def test_a_new_label_that_bridges_two_clusters():
    before = _facts("s1", [["blue_car"], ["blue_car"], ["car_wash"], ["art_museum"]])
    assert len(_concepts(finish_drafts(_table(before, schema.FACT_DRAFTS), T).nodes)) == 3
    after = before + _facts("s2", [["blue_car_wash"]])
    _check_facts(before, after, {"s2"})
    assert sorted(_concepts(finish_drafts(_table(after, schema.FACT_DRAFTS), T).nodes).values()) == [
        "art museum", "blue car"]


def test_a_removed_session_that_splits_a_cluster_is_clustered_again():
    """The bridge gone: without ``extends`` every label is clustered again and the cluster splits."""
    kept = _facts("s1", [["blue_car"], ["blue_car"], ["car_wash"]])
    before = kept + _facts("s2", [["blue_car_wash"]])
    _check_facts(before, kept, {"s2"}, extends=False)
    assert len(_concepts(finish_drafts(_table(kept, schema.FACT_DRAFTS), T).nodes)) == 2


def test_seeded_clusters_equal_clusters_of_every_pair():
    keys = ["a_b", "b_c", "c_d", "d_e", "x_y", "a_b_c", "y_z", "e_f"]
    full = cluster(sorted(keys), T)
    known = [{"a_b", "a_b_c", "b_c"}, {"x_y"}, {"d_e"}]  # clusters of the pairs among the grouped keys
    assert cluster(sorted(keys), T, known) == full


def _mention(session, i, name, label="PERSON", sentence=None):
    cited = sentence is not None
    return {"session_key": session, "tenant_id": "t", "name": name, "label": label,
            "turn_node_id": f"turn:{session}-{i}" if cited else None, "turn_id": f"{session}-{i}" if cited else None,
            "sentence": sentence}


def _triplet(session, i, subject, relation, obj, s_ent=True, o_ent=True):
    return {"session_key": session, "node_id": f"triplet:{session}-{i}-{relation}", "tenant_id": "t",
            "conversation_id": "c", "session_id": session, "time": None, "text": f"{subject} {relation} {obj}",
            "subject": subject, "relation": relation, "object": obj, "turn_node_id": f"turn:{session}-{i}",
            "turn_id": f"{session}-{i}", "speaker": "Ann", "subject_entity": subject if s_ent else None,
            "object_entity": obj if o_ent else None}


SESSIONS = {
    "s1": ([_mention("s1", 0, "Ann"), _mention("s1", 0, "Bob"), _mention("s1", 0, "Paris", "GPE", "Ann went to Paris."),
            _mention("s1", 1, "Acme", "ORG", "Bob works at Acme."),
            _mention("s1", 1, "the Louvre", "FAC", "Ann saw the Louvre.")],
           [_triplet("s1", 0, "Ann", "go to", "Paris"), _triplet("s1", 1, "Bob", "work at", "Acme"),
            _triplet("s1", 1, "Bob", "like", "Acme"), _triplet("s1", 2, "Ann", "see", "art", o_ent=False)]),
    "s2": ([_mention("s2", 0, "ANN"), _mention("s2", 0, "ANN"), _mention("s2", 0, "ANN"),
            _mention("s2", 0, "Paris", "GPE", "Paris was rainy."), _mention("s2", 0, "Acme", "GPE", "Acme is in Lyon."),
            _mention("s2", 1, "Acme", "GPE", "Acme moved."), _mention("s2", 1, "Zed", "PERSON", "Zed came.")],
           [_triplet("s2", 0, "Bob", "leave", "Acme"), _triplet("s2", 1, "Zed", "visit", "Paris")]),
    "s3": ([_mention("s3", 0, "Bob"), _mention("s3", 0, "Louvre's", "FAC", "The Louvre was closed.")],
           [_triplet("s3", 0, "Bob", "like", "Acme")]),
}


def _finish(sessions: list[str]):
    mentions = _table([m for s in sessions for m in SESSIONS[s][0]], schema.ENTITY_MENTIONS)
    triplets = _table([t for s in sessions for t in SESSIONS[s][1]], schema.TRIPLET_DRAFTS)
    return mentions, triplets, HeuristicTriplets().finish(mentions, triplets, ExtractionContext(
        turns=schema.empty(schema.TURNS), config=MemlibConfig()))


@pytest.mark.parametrize("before, after, dirty", [
    (["s1", "s3"], ["s1", "s2", "s3"], "s2"),   # a session added in the middle: new cites, names, labels
    (["s1", "s2", "s3"], ["s1", "s3"], "s2"),   # a session removed
    (["s1", "s2"], ["s1", "s2", "s3"], "s3"),   # a session added last
])
def test_entities_whose_mentions_change_equal_a_full_build(before, after, dirty):
    published = _finish(before)[2].nodes
    mentions, triplets, full = _finish(after)
    speakers = {"s2": {"ANN"}, "s3": {"Bob"}}[dirty]  # the speakers of the dirty session's turns
    turns = {f"turn:{dirty}-{i}" for i in range(3)}
    got, copied = triplets_reusing(mentions, triplets, None, MemlibConfig().triplets.description_chars,
                                   _prior(published, {dirty}, turns, speakers))
    assert got.nodes.equals(schema.conform(full.nodes, schema.NODES_NO_EMBEDDING))
    assert _edges(got.edges) == _edges(full.edges)
    relation = [(r["src"], r["dst"], r["relation"]) for r in full.edges.to_pylist() if r["kind"] == "RELATION"]
    assert relation == [(r["src"], r["dst"], r["relation"]) for r in got.edges.to_pylist() if r["kind"] == "RELATION"]
    assert copied > 0
    changed = {r["node_id"] for r in published.to_pylist()} ^ {r["node_id"] for r in full.nodes.to_pylist()}
    texts = {r["node_id"]: r["text"] for r in published.to_pylist()}
    assert changed or any(texts.get(r["node_id"]) != r["text"] for r in full.nodes.to_pylist())
