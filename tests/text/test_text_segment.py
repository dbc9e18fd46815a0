"""TextTiling-style segmentation over synthetic turn vectors."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from memlib import schema
from memlib.config import SegmentConfig
from memlib.text.segment import depth_scores, gap_similarities, segment_nodes_edges, segment_turns
from tests.text.conftest import make_turns, topic_vectors


def _session(n: int, sess: str = "S1", tenant: str = "t1"):
    return [(tenant, "c1", sess, 0, "Ana" if i % 2 == 0 else "Ben", f"turn {i} of {sess}", None) for i in range(n)]


def _lengths(segs) -> list[int]:
    return [len(x) for x in segs.column("turn_ids").to_pylist()]


def test_text_gap_similarity_and_depth_peak_at_topic_change():
    v = topic_vectors([0] * 6 + [1] * 6)
    sims = gap_similarities(v, 2)
    depths = depth_scores(sims)
    assert int(np.argmin(sims)) == 5 and int(np.argmax(depths)) == 5


def test_text_two_topics_split_at_change():
    turns = make_turns(_session(20))
    segs = segment_turns(turns, topic_vectors([0] * 9 + [1] * 11), SegmentConfig(min_turns=3, max_turns=24))
    schema.check(segs, schema.SEGMENTS)
    assert _lengths(segs) == [9, 11]
    ids = turns.column("node_id").to_pylist()
    assert segs.column("turn_ids").to_pylist() == [ids[:9], ids[9:]]
    assert segs.column("segment_index").to_pylist() == [0, 1]


def test_text_one_topic_no_split():
    turns = make_turns(_session(12))
    segs = segment_turns(turns, topic_vectors([0] * 12, noise=0.0), SegmentConfig(min_turns=3))
    assert _lengths(segs) == [12]


@pytest.mark.parametrize("min_turns,max_turns", [(3, 6), (4, 8), (5, 24), (2, 3)])
def test_text_min_max_lengths_respected(min_turns, max_turns):
    topics = [0] * 2 + [1] * 9 + [2] * 1 + [3] * 12 + [0] * 6
    turns = make_turns(_session(len(topics)))
    segs = segment_turns(turns, topic_vectors(topics, seed=3), SegmentConfig(min_turns=min_turns, max_turns=max_turns))
    lens = _lengths(segs)
    assert sum(lens) == len(topics)
    assert all(min_turns <= n <= max_turns for n in lens), lens


def test_text_segments_never_cross_sessions_or_tenants():
    rows = _session(7, "S1") + _session(5, "S2") + _session(6, "S1", tenant="t2")
    turns = make_turns(rows)
    perm = np.random.default_rng(0).permutation(turns.num_rows)
    shuffled = turns.take(perm)
    v = topic_vectors(list(range(18)))[perm]
    segs = pl.from_arrow(segment_turns(shuffled, v, SegmentConfig(min_turns=2, max_turns=4)))
    tdf = pl.from_arrow(turns).select("node_id", "tenant_id", "session_id", "turn_index")
    for row in segs.iter_rows(named=True):
        members = tdf.filter(pl.col("node_id").is_in(row["turn_ids"]))
        assert members["tenant_id"].unique().to_list() == [row["tenant_id"]]
        assert members["session_id"].unique().to_list() == [row["session_id"]]
        assert members["turn_index"].to_list() == sorted(members["turn_index"].to_list())
        assert 2 <= len(row["turn_ids"]) <= 4
    assert segs["turn_ids"].list.len().sum() == 18


def test_text_segment_ids_stable_and_vectors_checked():
    turns = make_turns(_session(10))
    v = topic_vectors([0] * 5 + [1] * 5)
    a = segment_turns(turns, v, SegmentConfig(min_turns=2))
    b = segment_turns(turns, v.copy(), SegmentConfig(min_turns=2))
    assert a.equals(b)
    with pytest.raises(ValueError):
        segment_turns(turns, v[:5], SegmentConfig())


def test_text_segment_nodes_edges():
    turns = make_turns(_session(10))
    segs = segment_turns(turns, topic_vectors([0] * 5 + [1] * 5), SegmentConfig(min_turns=2))
    nodes, edges = segment_nodes_edges(segs, turns)
    schema.check(nodes, schema.NODES_NO_EMBEDDING)
    schema.check(edges, schema.EDGES)
    assert nodes.column("node_id").to_pylist() == segs.column("segment_id").to_pylist()
    assert nodes.column("text").to_pylist()[0] == "Ana: turn 0 of S1 Ben: turn 1 of S1"
    kinds = pl.from_arrow(edges)["kind"].value_counts().sort("kind").rows()
    assert kinds == [("IN_SEGMENT", 10), ("IN_SESSION", 2)]
