from __future__ import annotations

import json

import polars as pl
import pytest

from memlib.config import MemlibConfig
from memlib.eval.questions import Dataset, select_questions
from memlib.eval.report import format_table
from memlib.eval.runner import run_eval
from memlib.io.store import StoreReader

PNG = b"\x89PNG\r\n\x1a\n"


def test_malformed_evidence_excluded_and_counted(tiny_store):
    reader = StoreReader(tiny_store)
    qset = select_questions(reader.table("questions"), reader, Dataset.LOCOMO)
    assert qset.n_input == 4 and qset.n_excluded_malformed == 1
    assert sorted(qset.frame.get_column("question_id")) == ["q1", "q2", "q3"]
    groups = dict(zip(qset.frame.get_column("question_id"), qset.frame.get_column("group")))
    assert groups["q3"] == "adversarial" and groups["q1"] == "overall"
    sess = dict(zip(qset.frame.get_column("question_id"), qset.frame.get_column("evidence_sessions").to_list()))
    assert sess["q1"] == ["S1"]


def test_run_eval_writes_report_and_plots(tiny_store, hash_embedder, tmp_path):
    reader = StoreReader(tiny_store)
    out = tmp_path / "eval"
    metrics = run_eval(tiny_store, reader.table("questions"), "bm25,dense,hybrid", [1, 3, 5], MemlibConfig(),
                       dataset=Dataset.LOCOMO, embedder=hash_embedder, out=out)
    assert metrics["n_questions"] == 2 and metrics["n_adversarial"] == 1 and metrics["n_excluded_malformed"] == 1
    bm25 = metrics["strategies"]["bm25"]
    assert set(bm25["by_category"]) == {"1", "4"}
    assert 0.0 <= bm25["turn_recall@5"] <= 1.0 and bm25["latency_ms_p95"] >= bm25["latency_ms_p50"] > 0
    assert bm25["adversarial"]["n_questions"] == 1
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["strategies"]["hybrid"]["turn_recall@5"] == metrics["strategies"]["hybrid"]["turn_recall@5"]
    pq = pl.read_parquet(out / "per_question.parquet")
    assert pq.height == 3 * 3 and {"ranked_turn_ids", "turn_recall@5", "latency_ms", "evidence"} <= set(pq.columns)
    assert pq.filter(pl.col("question_id") == "q1").get_column("ranked_turn_ids").list.len().min() > 0
    for png in ("recall_at_k.png", "by_category.png"):
        data = (out / png).read_bytes()
        assert data.startswith(PNG) and len(data) > 2000
    report = (out / "report.md").read_text()
    assert "| bm25 |" in report and "Adversarial" in report
    assert "turn_recall@5" in format_table(metrics)


def test_bm25_finds_lexical_evidence(tiny_store, hash_embedder):
    reader = StoreReader(tiny_store)
    metrics = run_eval(tiny_store, reader.table("questions"), ["bm25"], [5], MemlibConfig(),
                       dataset=Dataset.LOCOMO, embedder=hash_embedder)
    assert metrics["strategies"]["bm25"]["turn_recall@5"] == pytest.approx(1.0)


QUERIES = ["Who adopted a dog?", "pottery",
           "When did Caroline go to the LGBTQ support group and what did she learn about herself there?",
           "What is Melanie's favourite book and why does she keep rereading it every summer at the lake?"]


def test_questions_are_embedded_one_per_call():
    """Evaluation embeds its questions up front, one per call, as the service embeds the one
    query of a request (memlib.retrieve.tenant.CachedQueryEmbedder.prime)."""
    import numpy as np

    from memlib.retrieve.tenant import CachedQueryEmbedder

    calls: list[list[str]] = []

    class Recording:
        def embed_queries(self, texts):
            calls.append(list(texts))
            return np.ones((len(texts), 4), dtype=np.float32)

    cached = CachedQueryEmbedder(Recording())
    cached.prime(QUERIES + QUERIES[:2])
    assert calls == [[q] for q in QUERIES]  # each distinct question once, alone
    cached.embed_queries(QUERIES)
    assert len(calls) == len(QUERIES)  # cached


def test_eval_query_vectors_are_the_services():
    """With the default int8 encoder a batch changes a query's vector (activations are quantized
    per batch tensor: up to 0.023 in a coordinate for these four on an AVX2 CPU); eval's vectors
    must be the ones a service request computes."""
    import numpy as np

    from memlib.embed import get_embedder
    from memlib.retrieve.tenant import CachedQueryEmbedder

    embedder = get_embedder(MemlibConfig().embed)
    cached = CachedQueryEmbedder(embedder)
    cached.prime(QUERIES)
    for q in QUERIES:
        assert np.array_equal(cached.embed_queries([q])[0], embedder.embed_queries([q])[0]), q


def test_category_legend_covers_no_bar():
    """by_category.png: with every bar tall (a good strategy), the legend inside the axes covered the
    first bars; it sits right of them."""
    import matplotlib.pyplot as plt

    from memlib.eval.report import category_figure

    cats = ["multi-hop", "open-domain", "single-hop", "temporal"]
    metrics = {"strategies": {name: {"by_category": {c: {"turn_recall@5": 0.97 - 0.01 * i} for c in cats}}
                              for i, name in enumerate(["auto", "bm25", "dense", "hybrid", "magma"])}}
    fig = category_figure(metrics, "turn_recall@5")
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        legend = ax.get_legend().get_window_extent()
        bars = [p.get_window_extent() for p in ax.patches]
        assert len(bars) == 20
        covered = [i for i, b in enumerate(bars) if b.overlaps(legend)]
        assert not covered, f"the legend covers bars {covered}"
    finally:
        plt.close(fig)
