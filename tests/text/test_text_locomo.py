"""All text stages chained over the LoCoMo dev3 turns: schemas, closure of edges, runtime, stable ids."""
from __future__ import annotations

import time
import zlib

import numpy as np
import pyarrow as pa
import pytest

from memlib import schema
from memlib.config import ClueConfig, GateConfig, SegmentConfig
from memlib.text.clues import merge_clues, session_clues, similar_edges
from memlib.text.gate import gate_turns
from memlib.text.lexicon import words
from memlib.text.segment import segment_nodes_edges, segment_turns
from memlib.text.structure import session_nodes, structure_edges, turn_nodes

DIM = 256


def hashed_vectors(texts: list[str]) -> np.ndarray:
    """Stand-in embeddings (hashed bag of lowercase words), so no model runs in this test."""
    v = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, t in enumerate(texts):
        for w in words(t):
            v[i, zlib.crc32(w.lower().encode()) % DIM] += 1.0
    v[:, 0] += 1e-3
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def run_all(turns: pa.Table) -> dict[str, pa.Table]:
    tn = turn_nodes(turns)
    tv = hashed_vectors(tn.column("text").to_pylist())
    segs = gate_turns(turns, segment_turns(turns, tv, SegmentConfig()), GateConfig())
    sn, se = segment_nodes_edges(segs, turns)
    cn, ce = session_clues(turns, segs, ClueConfig())
    cn, ce, _ = merge_clues(cn, hashed_vectors(cn.column("text").to_pylist()), ClueConfig().merge_threshold, ce)
    sim = similar_edges(tn.column("node_id"), tn.column("tenant_id"), tv, 0.8)
    nodes = pa.concat_tables([tn, sn, session_nodes(turns, segs), cn])
    edges = pa.concat_tables([structure_edges(turns), se, ce, sim])
    return {"segments": segs, "nodes": nodes, "edges": edges}


@pytest.fixture(scope="module")
def locomo_turns(locomo_path):
    readers = pytest.importorskip("memlib.io.readers")
    return readers.read_input(locomo_path, "locomo").turns


def test_text_locomo_pipeline_fast_and_consistent(locomo_turns):
    t0 = time.perf_counter()
    out = run_all(locomo_turns)
    elapsed = time.perf_counter() - t0
    assert elapsed < 30, f"text stages took {elapsed:.1f}s on {locomo_turns.num_rows} turns"
    schema.check(out["segments"], schema.SEGMENTS)
    schema.check(out["nodes"], schema.NODES_NO_EMBEDDING)
    schema.check(out["edges"], schema.EDGES)
    node_ids = set(out["nodes"].column("node_id").to_pylist())
    assert len(node_ids) == out["nodes"].num_rows
    edges = out["edges"]
    assert set(edges.column("src").to_pylist()) <= node_ids
    assert set(edges.column("dst").to_pylist()) <= node_ids
    segs = out["segments"]
    lens = [len(x) for x in segs.column("turn_ids").to_pylist()]
    assert sum(lens) == locomo_turns.num_rows
    assert max(lens) <= SegmentConfig().max_turns
    kept = sum(len(x) for x in segs.column("kept_turn_ids").to_pylist())
    assert 0.3 * locomo_turns.num_rows < kept < locomo_turns.num_rows
    summaries = segs.column("summary").to_pylist()
    assert sum(bool(s) for s in summaries) > 0.9 * len(summaries)


def test_text_locomo_ids_identical_across_runs(locomo_turns):
    a, b = run_all(locomo_turns), run_all(locomo_turns)
    for name in a:
        assert a[name].equals(b[name]), name
