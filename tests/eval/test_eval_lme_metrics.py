"""LongMemEval's own retrieval metrics (memlib/eval/lme.py), on hand-computed cases."""
from __future__ import annotations

import math

import polars as pl
import pyarrow as pa
import pytest

from memlib.config import MemlibConfig
from memlib.eval import lme
from memlib.eval.questions import Dataset
from memlib.eval.report import lme_table
from memlib.eval.runner import run_eval
from memlib.io.store import StoreReader


def sess(turns):
    return [t.split(":")[0] for t in turns]


def test_dcg_leaves_rank_two_undiscounted():
    # the benchmark's DCG: rel_1 + sum_{p>=2} rel_p / log2(p); ranks 1 and 2 weigh the same
    assert lme.dcg([0, 1, 1], 3) == pytest.approx(1 / math.log2(2) + 1 / math.log2(3))
    assert lme.dcg([1, 1], 10) == pytest.approx(2.0)
    assert lme.dcg([1, 0, 0, 1], 3) == pytest.approx(1.0)  # cut at k
    assert lme.dcg([], 5) == 0.0


def test_turn_level_recall_all_any_and_ndcg():
    ranked = ["A:0", "B:1", "B:3", "C:0"]
    ev = ["B:3", "C:0"]
    assert lme.score_ranking(ranked, ev, 2, 2) == (0.0, 0.0, 0.0)
    any3, all3, ndcg3 = lme.score_ranking(ranked, ev, 2, 3)
    assert (any3, all3) == (1.0, 0.0)
    assert ndcg3 == pytest.approx((1 / math.log2(3)) / 2.0)  # one hit at rank 3; ideal two hits = 1 + 1
    any4, all4, ndcg4 = lme.score_ranking(ranked, ev, 2, 4)
    assert (any4, all4) == (1.0, 1.0)
    assert ndcg4 == pytest.approx((1 / math.log2(3) + 1 / math.log2(4)) / 2.0)


def test_turn_level_question_at_official_cutoffs():
    ranked = [f"F{i}:0" for i in range(6)] + ["A:2"] + [f"G{i}:0" for i in range(50)] + ["A:7"]
    s = lme.score_question(ranked, sess(ranked), ["A:2", "A:7"], ["A", "A"], ["A"])
    assert s["lme_turn_recall_any@5"] == 0.0 and s["lme_turn_recall_any@10"] == 1.0
    assert s["lme_turn_recall_all@10"] == 0.0 and s["lme_turn_recall_all@50"] == 0.0  # A:7 is rank 58
    # one hit at rank 7 of 2 relevant: (1/log2 7) / (1 + 1)
    assert s["lme_turn_ndcg_any@10"] == pytest.approx(1 / math.log2(7) / 2)


def test_session_level_grows_the_cutoff_over_noans_documents():
    # A is the answer session, A:3 its evidence turn. A:0 is a non-evidence turn of A: its own
    # document ("noans"), so it does not make A found, and the second B turn repeats a document:
    # the top 5 turns span 4 documents, the cut-off grows to 6 and takes A:3 in.
    ranked = ["A:0", "B:0", "B:1", "C:0", "D:0", "A:3", "E:0"]
    s = lme.score_question(ranked, sess(ranked), ["A:3"], ["A"], ["A"])
    assert s["lme_turn_recall_all@5"] == 0.0
    assert s["lme_session_recall_all@5"] == 1.0 and s["lme_session_recall_any@5"] == 1.0
    assert s["lme_session_ndcg_any@5"] == pytest.approx(1 / math.log2(6))  # hit at rank 6, ideal 1


def test_session_found_only_through_an_evidence_turn():
    # session A is ranked first, but by a non-evidence turn: not found at session level
    ranked = ["A:0", "B:0", "C:0", "D:0", "E:0", "F:0", "G:0", "H:0", "I:0", "J:0", "K:0"]
    s = lme.score_question(ranked, sess(ranked), ["A:5"], ["A"], ["A"])
    assert s["lme_session_recall_any@5"] == 0.0 and s["lme_session_recall_all@10"] == 0.0
    assert s["lme_session_ndcg_any@10"] == 0.0


def test_session_recall_all_needs_every_evidence_session():
    ranked = ["A:1", "X:0", "Y:0", "Z:0", "W:0", "B:2", "V:0", "U:0", "T:0", "S:0", "R:0"]
    s = lme.score_question(ranked, sess(ranked), ["A:1", "B:2", "B:4"], ["A", "B", "B"], ["A", "B"])
    assert s["lme_session_recall_any@5"] == 1.0 and s["lme_session_recall_all@5"] == 0.0
    assert s["lme_session_recall_all@10"] == 1.0
    # gains per evidence turn: ranks 1 and 6 hit of 3 relevant turns; ideal 1 + 1 + 1/log2(3)
    assert s["lme_session_ndcg_any@10"] == pytest.approx((1 + 1 / math.log2(6)) / (2 + 1 / math.log2(3)))
    # an answer session without an evidence turn is not required (the benchmark renames it "noans")
    s2 = lme.score_question(ranked, sess(ranked), ["A:1"], ["A"], ["A", "Q"])
    assert s2["lme_session_recall_all@5"] == 1.0


def test_grown_cutoff_past_a_short_list():
    assert lme.grown_cutoff(["A", "A", "B"], 2) == 3
    assert lme.grown_cutoff(["A", "A"], 2) == 3   # never 2 distinct: list length + 1
    assert lme.grown_cutoff(["A"], 5) == 5


def _lme_questions() -> pa.Table:
    # the tiny store's turns: S1 = D1:1..3 (puppy), S2 = D2:1..3 (violin, Berlin)
    return pa.Table.from_pylist([
        dict(tenant_id="conv-a", question_id="q1", question="What breed is Ann's puppy Biscuit?",
             answer="golden retriever", category="single-session-user", evidence=["D1:3"], evidence_sessions=["S1"]),
        dict(tenant_id="conv-a", question_id="q2", question="Where does Ann's sister play violin?",
             answer="Berlin", category="multi-session", evidence=["D2:2", "D1:1"], evidence_sessions=["S2", "S1"]),
        dict(tenant_id="conv-a", question_id="q3_abs", question="Who went to Paris?",
             answer="nobody", category="single-session-user", evidence=[], evidence_sessions=[]),
    ])


def test_eval_reports_lme_metrics_per_type_without_abstention(tiny_store, hash_embedder):
    run = run_eval(tiny_store, _lme_questions(), ["bm25"], [1, 5], MemlibConfig(), dataset=Dataset.LONGMEMEVAL,
                   embedder=hash_embedder)
    assert run["n_questions"] == 2 and run["n_excluded_abstention"] == 1
    bm25 = run["strategies"]["bm25"]
    # 6 turns in all: every evidence turn is in the top 5 ... except when ranked 6th; top 50 has all
    assert bm25["lme_turn_recall_all@50"] == 1.0 and bm25["lme_turn_recall_any@5"] == 1.0
    assert set(bm25["by_category"]) == {"single-session-user", "multi-session"}
    assert "lme_session_recall_all@5" in bm25["by_category"]["multi-session"]
    table = lme_table(run)
    assert "1 abstention questions excluded" in table and "easier" in table and "| bm25 |" in table


def test_lme_metrics_match_per_question_rows(tiny_store, hash_embedder):
    from memlib.eval.runner import evaluate

    run = evaluate(tiny_store, _lme_questions(), ["bm25"], [5], MemlibConfig(), dataset=Dataset.LONGMEMEVAL,
                   embedder=hash_embedder)
    pq = run.per_question
    for row in pq.iter_rows(named=True):
        again = lme.score_question(row["ranked_turn_ids"], row["ranked_turn_sessions"], row["evidence"],
                                   row["evidence_turn_sessions"], row["evidence_sessions"])
        assert all(row[k] == pytest.approx(v) for k, v in again.items())
    assert pq.filter(pl.col("question_id") == "q2").get_column("evidence_turn_sessions").to_list()[0] in (
        ["S2", "S1"], ["S1", "S2"])
    # LoCoMo runs carry no LongMemEval columns
    reader = StoreReader(tiny_store)
    loco = evaluate(tiny_store, reader.table("questions"), ["bm25"], [5], MemlibConfig(), dataset=Dataset.LOCOMO,
                    embedder=hash_embedder)
    assert not any(c.startswith("lme_") for c in loco.per_question.columns)
