"""Retrieval metrics, exactly as docs/evaluation.md ("memlib's metrics") defines them.

Protocol
--------
* Questions: LoCoMo categories 1-4 with at least one evidence id that exists in the
  conversation (evidence ids that do not exist are dropped; a question left with none is
  excluded and counted as ``n_excluded_malformed``); category 5 (adversarial) is scored
  separately and kept out of the overall. LongMemEval: every question except abstention
  ones (id ending in ``_abs``); evidence = turns flagged ``has_answer``, sessions =
  ``answer_session_ids``.
* A strategy returns ranked nodes; each expands to its source turns through provenance,
  de-duplicated in rank order. That ranked turn list is what is scored.
* ``turn_recall@k``: share of the question's evidence turns among the top-k turns,
  averaged over questions. ``turn_recall_all@k``: share of questions with all evidence in
  the top k. ``session_recall@k``: share of the evidence sessions among the top-k
  distinct sessions (in the order their first turn is ranked). ``turn_ndcg@k``: binary
  gain, DCG = sum over hits of 1/log2(rank+1), normalized by the ideal DCG of
  min(|evidence|, k) hits.
* LongMemEval also gets the benchmark's own recall_all@k, ndcg_any@k and recall_any@k at turn
  and session level (``lme_turn_*``, ``lme_session_*``; definitions in :mod:`memlib.eval.lme`).
* Latency: per-query wall time of the in-process search, p50/p95 in milliseconds.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import polars as pl

from memlib.eval import lme

TURN_RECALL = "turn_recall"
TURN_RECALL_ALL = "turn_recall_all"
SESSION_RECALL = "session_recall"
TURN_NDCG = "turn_ndcg"
METRIC_NAMES = (TURN_RECALL, TURN_RECALL_ALL, SESSION_RECALL, TURN_NDCG, *lme.names())


def metric_key(name: str, k: int) -> str:
    return f"{name}@{k}"


def distinct_in_order(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def hit_matrix(ranked: Sequence[Sequence[str]], relevant: Sequence[Iterable[str]], depth: int) -> np.ndarray:
    """(n_questions, depth) bool: is the item at rank j of question i relevant?
    Ranked lists are de-duplicated in order first; short lists are padded with misses."""
    hits = np.zeros((len(ranked), depth), dtype=bool)
    for i, (items, rel) in enumerate(zip(ranked, relevant)):
        rel_set = set(rel)
        row = [x in rel_set for x in distinct_in_order(items)[:depth]]
        hits[i, :len(row)] = row
    return hits


def _counts(relevant: Sequence[Iterable[str]]) -> np.ndarray:
    return np.array([len(set(r)) for r in relevant], dtype=np.float64)


def recall_at(hits: np.ndarray, n_rel: np.ndarray, k: int) -> np.ndarray:
    """Per-question fractional recall@k (0 where a question has no relevant items)."""
    found = hits[:, :k].sum(axis=1)
    return np.divide(found, n_rel, out=np.zeros(len(n_rel)), where=n_rel > 0)


def recall_all_at(hits: np.ndarray, n_rel: np.ndarray, k: int) -> np.ndarray:
    found = hits[:, :k].sum(axis=1)
    return ((found >= n_rel) & (n_rel > 0)).astype(np.float64)


def ndcg_at(hits: np.ndarray, n_rel: np.ndarray, k: int) -> np.ndarray:
    """Binary-gain nDCG@k per question."""
    depth = min(k, hits.shape[1])
    disc = 1.0 / np.log2(np.arange(2, depth + 2))
    dcg = (hits[:, :depth] * disc).sum(axis=1)
    ideal_hits = np.minimum(n_rel, depth).astype(int)
    cum = np.concatenate([[0.0], np.cumsum(disc)])
    idcg = cum[ideal_hits]
    return np.divide(dcg, idcg, out=np.zeros(len(n_rel)), where=idcg > 0)


def score_questions(ranked_turns: Sequence[Sequence[str]], evidence: Sequence[Iterable[str]],
                    ranked_sessions: Sequence[Sequence[str]], evidence_sessions: Sequence[Iterable[str]],
                    ks: Sequence[int]) -> dict[str, np.ndarray]:
    """Per-question metrics for every k: ``{"turn_recall@5": array(n), ...}``."""
    ks = sorted(set(int(k) for k in ks))
    depth = max(ks) if ks else 0
    t_hits, t_rel = hit_matrix(ranked_turns, evidence, depth), _counts(evidence)
    s_hits, s_rel = hit_matrix(ranked_sessions, evidence_sessions, depth), _counts(evidence_sessions)
    out: dict[str, np.ndarray] = {}
    for k in ks:
        out[metric_key(TURN_RECALL, k)] = recall_at(t_hits, t_rel, k)
        out[metric_key(TURN_RECALL_ALL, k)] = recall_all_at(t_hits, t_rel, k)
        out[metric_key(SESSION_RECALL, k)] = recall_at(s_hits, s_rel, k)
        out[metric_key(TURN_NDCG, k)] = ndcg_at(t_hits, t_rel, k)
    return out


def metric_columns(frame: pl.DataFrame) -> list[str]:
    return [c for c in frame.columns if "@" in c and c.split("@")[0] in METRIC_NAMES]


def summarize(frame: pl.DataFrame) -> dict[str, float]:
    """Means of the metric columns and latency percentiles of a per-question frame."""
    cols = metric_columns(frame)
    out: dict[str, float] = {"n_questions": int(frame.height)}
    if frame.height == 0:
        return out
    means = frame.select([pl.col(c).mean() for c in cols]).row(0, named=True)
    out.update({c: float(v) for c, v in means.items()})
    if "latency_ms" in frame.columns:
        lat = frame.get_column("latency_ms").to_numpy()
        out["latency_ms_p50"] = float(np.percentile(lat, 50))
        out["latency_ms_p95"] = float(np.percentile(lat, 95))
    if "warmup_ms" in frame.columns:
        warm = frame.get_column("warmup_ms").drop_nulls().to_numpy()
        if warm.size:
            out["warmup_ms_max"] = float(warm.max())  # one-off per-tenant cost (first query)
    return out


def by_category(frame: pl.DataFrame) -> dict[str, dict[str, float]]:
    """:func:`summarize` per category (sorted by category name)."""
    if frame.height == 0:
        return {}
    cats = sorted(frame.get_column("category").cast(pl.Utf8).fill_null("none").unique().to_list())
    col = pl.col("category").cast(pl.Utf8).fill_null("none")
    return {c: summarize(frame.filter(col == c)) for c in cats}
