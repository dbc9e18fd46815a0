from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from memlib.eval import metrics as m


def score(ranked, evidence, ks=(1, 2, 3, 5)):
    sess = [[t.split(":")[0] for t in r] for r in ranked]
    ev_s = [{t.split(":")[0] for t in e} for e in evidence]
    return m.score_questions(ranked, evidence, [m.distinct_in_order(s) for s in sess], ev_s, ks)


def test_multi_evidence_fractional_recall_and_all():
    s = score([["D1:1", "D2:5", "D1:3", "D3:1"]], [["D1:3", "D3:1"]])
    assert s["turn_recall@1"][0] == 0.0
    assert s["turn_recall@3"][0] == pytest.approx(0.5)
    assert s["turn_recall_all@3"][0] == 0.0
    assert s["turn_recall@5"][0] == 1.0 and s["turn_recall_all@5"][0] == 1.0


def test_ndcg_binary_gain_hand_computed():
    s = score([["a:1", "a:2", "a:3"]], [["a:2", "a:3"]], ks=(3,))
    dcg = 1 / math.log2(3) + 1 / math.log2(4)
    idcg = 1 + 1 / math.log2(3)
    assert s["turn_ndcg@3"][0] == pytest.approx(dcg / idcg)


def test_duplicate_turns_from_several_facts_count_once():
    # two facts citing the same turn: the expanded list repeats it; it must count once and
    # must not push the next distinct turn out of the top k
    s = score([["D1:1", "D1:1", "D1:2", "D1:1"]], [["D1:1", "D1:2"]], ks=(2,))
    assert s["turn_recall@2"][0] == 1.0
    assert s["turn_ndcg@2"][0] == pytest.approx(1.0)


def test_k_larger_than_list():
    s = score([["D1:1"]], [["D1:1", "D4:4"]], ks=(1, 20))
    assert s["turn_recall@20"][0] == pytest.approx(0.5)
    assert s["turn_ndcg@20"][0] == pytest.approx(1.0 / (1 + 1 / math.log2(3)))
    assert s["session_recall@20"][0] == pytest.approx(0.5)


def test_session_recall_over_distinct_sessions():
    ranked = [["D1:1", "D1:2", "D1:3", "D2:1"]]
    s = score(ranked, [["D2:1"]], ks=(1, 2))
    assert s["session_recall@1"][0] == 0.0 and s["session_recall@2"][0] == 1.0
    assert s["turn_recall@2"][0] == 0.0


def test_empty_ranking_scores_zero():
    s = score([[]], [["D1:1"]], ks=(5,))
    assert all(v[0] == 0.0 for v in s.values())


def test_summarize_and_by_category():
    frame = pl.DataFrame({"category": ["1", "1", "2"], "turn_recall@5": [1.0, 0.0, 0.5],
                          "latency_ms": [1.0, 3.0, 10.0]})
    s = m.summarize(frame)
    assert s["n_questions"] == 3 and s["turn_recall@5"] == pytest.approx(0.5)
    assert s["latency_ms_p50"] == 3.0 and s["latency_ms_p95"] == pytest.approx(np.percentile([1, 3, 10], 95))
    cat = m.by_category(frame)
    assert cat["1"]["turn_recall@5"] == 0.5 and cat["2"]["n_questions"] == 1
