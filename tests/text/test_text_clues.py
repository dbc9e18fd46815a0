"""AssoMem clues: per-session clues, merge by cosine, SIMILAR edges."""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from memlib import ids, schema
from memlib.config import ClueConfig, SegmentConfig
from memlib.text.clues import merge_clues, merged_vectors, session_clues, similar_edges
from memlib.text.gate import gate_turns
from memlib.text.segment import segment_turns
from tests.text.conftest import topic_vectors


@pytest.fixture
def clues(turns):
    segs = gate_turns(turns, segment_turns(turns, topic_vectors([0] * turns.num_rows), SegmentConfig(min_turns=2)))
    return segs, *session_clues(turns, segs, ClueConfig(keyphrases=4))


def test_text_session_clues_one_per_session(turns, clues):
    segs, nodes, edges = clues
    schema.check(nodes, schema.NODES_NO_EMBEDDING)
    schema.check(edges, schema.EDGES)
    assert nodes.num_rows == 3
    first = nodes.to_pylist()[0]
    assert first["text"].startswith("Ana & Ben: ")
    assert "Ana" not in first["text"].split(": ", 1)[1]
    assert first["provenance"] == turns.column("node_id").to_pylist()[:8]
    assert first["node_id"] == ids.make_id("clue", "t1", "c1", "S1")
    e = pl.from_arrow(edges)
    assert set(e["kind"].to_list()) == {"HAS_CLUE"}
    assert len(e) == 3 + segs.num_rows
    assert set(e["src"].to_list()) >= {ids.session_node_id("t1", "c1", "S2")}


def test_text_merge_clues_near_identical_only(clues):
    _, nodes, edges = clues
    v = topic_vectors([0, 1, 2], noise=0.0)
    v[1] = v[0] + 0.001 * np.random.default_rng(1).normal(size=v.shape[1])
    merged, new_edges, id_map = merge_clues(nodes, v, 0.92, edges=edges)
    schema.check(merged, schema.NODES_NO_EMBEDDING)
    ids_in = nodes.column("node_id").to_pylist()
    assert merged.num_rows == 2
    assert id_map[ids_in[0]] == id_map[ids_in[1]] != ids_in[0]
    assert id_map[ids_in[2]] == ids_in[2]
    row = next(r for r in merged.to_pylist() if r["node_id"] == id_map[ids_in[0]])
    first, second = (set(nodes.column("provenance")[i].as_py()) for i in (0, 1))
    assert set(row["provenance"]) == first | second
    assert json.loads(row["attributes"])["merged_from"] == ids_in[:2]
    dsts = set(pl.from_arrow(new_edges)["dst"].to_list())
    assert dsts == set(merged.column("node_id").to_pylist())
    rebuilt = merge_clues(nodes, v, 0.92)[1]
    assert rebuilt.num_rows == 3 and set(rebuilt.column("dst").to_pylist()) == dsts
    mv = merged_vectors(id_map, ids_in, v, merged.column("node_id").to_pylist())
    assert mv.shape == (2, v.shape[1]) and np.allclose(np.linalg.norm(mv, axis=1), 1.0)
    assert merge_clues(nodes, v, 0.92)[0].equals(merged)  # stable ids


def test_text_merge_clues_never_across_tenants(clues):
    _, nodes, _ = clues
    v = np.ones((3, 8), dtype=np.float32)  # all identical; t1 has two clues, t2 one
    merged, _, id_map = merge_clues(nodes, v, 0.5)
    assert merged.num_rows == 2
    assert sorted(merged.column("tenant_id").to_pylist()) == ["t1", "t2"]


def test_text_similar_edges_respect_tenants_and_threshold():
    v = topic_vectors([0, 0, 0, 1, 0, 0], noise=0.01)
    node_ids = [f"turn:{i}" for i in range(6)]
    tenants = ["a", "a", "a", "a", "b", "b"]
    edges = similar_edges(node_ids, tenants, v, 0.9, top_k=5)
    schema.check(edges, schema.EDGES)
    pairs = {(r["src"], r["dst"]) for r in edges.to_pylist()}
    assert pairs == {("turn:0", "turn:1"), ("turn:0", "turn:2"), ("turn:1", "turn:2"), ("turn:4", "turn:5")}
    assert all(r["weight"] > 0.9 and r["kind"] == "SIMILAR" for r in edges.to_pylist())
    assert {r["tenant_id"] for r in edges.to_pylist() if r["src"] == "turn:4"} == {"b"}


@pytest.mark.heavy
def test_text_similar_edges_top_k_and_blocks():
    rng = np.random.default_rng(0)
    v = np.repeat(rng.normal(size=(1, 16)), 2500, axis=0) + 0.001 * rng.normal(size=(2500, 16))
    edges = similar_edges([f"n{i:05d}" for i in range(2500)], ["t"] * 2500, v, 0.5, top_k=2)
    src_counts = pl.from_arrow(edges.select(["src", "dst"])).unpivot().group_by("value").len()
    assert edges.num_rows <= 2 * 2500 and src_counts["len"].max() >= 2


def test_clue_drafts_per_session_give_the_clues_of_the_whole_tenant():
    """Drafted one session at a time (as the build keeps them) and ranked together, the clues equal
    the clues of every session drafted at once; a session whose candidates hold another session's
    speaker name is scored again under the tenant's ban (Cleo speaks only in S2, so "Cleo" may not
    stay in S1's phrases although S1's own ban does not know her)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from memlib.text.clues import clue_drafts, clues_from_drafts
    from tests.text.conftest import make_turns

    rows = [("t1", "c1", "S1", 0, "Ana", "Cleo Marsh taught the pottery class at the community center.", None),
            ("t1", "c1", "S1", 0, "Ben", "The pottery class sounds great, and the kiln too.", None),
            ("t1", "c1", "S2", 1, "Cleo", "I moved to Denver for a new job at a bakery.", None),
            ("t1", "c1", "S2", 1, "Ana", "Sourdough bread at the bakery every morning.", None)]
    turns = make_turns(rows)
    cfg = ClueConfig(keyphrases=4)
    whole_nodes, whole_edges = session_clues(turns, None, cfg)
    per_session = pa.concat_tables([clue_drafts(turns.filter(pc.equal(turns.column("session_id"), s)))
                                    for s in ("S1", "S2")])
    nodes, edges = clues_from_drafts(per_session, None, cfg)
    assert nodes.equals(whole_nodes) and edges.equals(whole_edges)
    s1_draft = per_session.to_pylist()[0]
    assert any("Cleo" in k or "cleo" in k for k in s1_draft["keys"])  # S1's own ban kept her
    s1 = json.loads(nodes.to_pylist()[0]["attributes"])["keyphrases"]
    assert s1 and not any("cleo" in p.lower() for p in s1)            # the tenant's ban removed her
