"""LongMemEval's own retrieval metrics, computed the way the benchmark's evaluation code does.

The benchmark (xiaowu0162/LongMemEval, ``src/retrieval/eval_utils.py`` and
``src/evaluation/print_retrieval_metrics.py``) scores a ranked list of corpus items per
question with three numbers at a cut-off ``k``:

* ``recall_any@k``: 1 when at least one relevant item is in the top k (the easier metric,
  the one most memory projects report);
* ``recall_all@k``: 1 when every relevant item is in the top k;
* ``ndcg_any@k``: binary-gain nDCG with the benchmark's DCG, in which the first rank is not
  discounted and rank ``p >= 2`` is discounted by ``log2(p)`` (not ``log2(p + 1)``):
  ``DCG = rel_1 + sum_{p=2..k} rel_p / log2(p)``, divided by the DCG of the ideal order
  (every relevant item first), 0 when there is none.

It reports session-level recall_all and ndcg_any at k = 5, 10 and turn-level ones at
k = 5, 10, 50, averaged over the questions whose id does not end in ``_abs``.

Turn level: the ranked turns against the evidence turns (``has_answer``). Session level, for a
retriever that ranks turns (as every memlib strategy does), the benchmark converts the turn
ranking (``evaluate_retrieval_turn2session``): each turn becomes a document id, its session's
id, except that the turns of an answer session that are not evidence get a separate id of
their own (the benchmark renames them ``noans``); the relevant documents are the sessions of
the evidence turns; the cut-off grows from k until the top turns span k distinct document
ids, and recall and nDCG are computed over the turns up to that cut-off. So an answer session
counts as found only when one of its evidence turns is ranked, and the session nDCG is a turn
nDCG at the grown cut-off.

One difference from the benchmark's reference retrievers, which index user turns only:
memlib ranks every turn (user and assistant) and the evidence includes assistant turns
flagged ``has_answer`` (single-session-assistant questions), which the reference corpus
cannot contain (there its turn metrics for those questions are vacuous: recall_all 1,
ndcg 0). A ranked list shorter than the grown cut-off counts the missing ranks as misses.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

RECALL_ANY = "recall_any"
RECALL_ALL = "recall_all"
NDCG_ANY = "ndcg_any"
LME_TURN = "lme_turn"
LME_SESSION = "lme_session"
TURN_KS = (5, 10, 50)
SESSION_KS = (5, 10)
# rank depth the runner asks for on LongMemEval: turn@50 plus room for the session cut-off to grow
DEPTH = 100
NOANS = "\x00noans"  # suffix of the document id of an answer session's non-evidence turns


def names() -> tuple[str, ...]:
    """Metric name prefixes (before ``@k``) this module produces."""
    return tuple(f"{level}_{m}" for level in (LME_TURN, LME_SESSION) for m in (RECALL_ALL, NDCG_ANY, RECALL_ANY))


def dcg(relevances: Sequence[float], k: int) -> float:
    """The benchmark's DCG of the first ``k`` relevances: rank 1 undiscounted, rank p by log2(p)."""
    rel = np.asarray(relevances, dtype=np.float64)[:k]
    if rel.size == 0:
        return 0.0
    return float(rel[0] + np.sum(rel[1:] / np.log2(np.arange(2, rel.size + 1))))


def score_ranking(docs: Sequence[str], relevant: Iterable[str], n_relevant_items: int,
                  k: int) -> tuple[float, float, float]:
    """(recall_any, recall_all, ndcg_any) at ``k`` of ranked document ids against the relevant
    document ids. ``docs`` may repeat an id (the session-level conversion maps several turns to
    one id); every ranked item whose id is relevant has gain 1, and the ideal ordering puts all
    ``n_relevant_items`` relevant corpus items first (as the benchmark sorts the whole corpus)."""
    rel_set = set(relevant)
    top = set(docs[:k])
    recall_any = float(any(d in top for d in rel_set))
    recall_all = float(all(d in top for d in rel_set))
    ideal = dcg([1.0] * n_relevant_items, k)
    ndcg = dcg([1.0 if d in rel_set else 0.0 for d in docs], k) / ideal if ideal > 0 else 0.0
    return recall_any, recall_all, ndcg


def turn_documents(ranked_turns: Sequence[str], ranked_sessions: Sequence[str], evidence: Iterable[str],
                   answer_sessions: Iterable[str]) -> list[str]:
    """Document id of every ranked turn for the session-level conversion: its session, or a
    separate id for a turn of an answer session that is not evidence."""
    ev = set(evidence)
    answer = set(answer_sessions)
    return [s if (t in ev or s not in answer) else s + NOANS for t, s in zip(ranked_turns, ranked_sessions)]


def grown_cutoff(docs: Sequence[str], k: int) -> int:
    """Smallest cut-off >= k at which the top docs span k distinct ids; when they never do, the
    list's length plus one, as the benchmark's loop ends past its corpus."""
    seen: set[str] = set()
    for i, d in enumerate(docs):
        seen.add(d)
        if i + 1 >= k and len(seen) >= k:
            return i + 1
    return max(k, len(docs) + 1)


def score_question(ranked_turns: Sequence[str], ranked_sessions: Sequence[str], evidence: Sequence[str],
                   evidence_turn_sessions: Sequence[str], answer_sessions: Iterable[str]) -> dict[str, float]:
    """Every LongMemEval metric of one question: ``{"lme_turn_recall_all@5": 1.0, ...}``.
    ``ranked_sessions[i]`` is the session of ``ranked_turns[i]``, ``evidence_turn_sessions[j]``
    the session of ``evidence[j]``; ``answer_sessions`` are the question's ``answer_session_ids``."""
    turns = list(dict.fromkeys(ranked_turns))
    session_of = dict(zip(ranked_turns, ranked_sessions))
    ev = list(dict.fromkeys(evidence))
    out: dict[str, float] = {}
    for k in TURN_KS:
        _put(out, LME_TURN, k, score_ranking(turns, ev, len(ev), k))
    docs = turn_documents(turns, [session_of[t] for t in turns], ev, answer_sessions)
    for k in SESSION_KS:
        _put(out, LME_SESSION, k, score_ranking(docs, set(evidence_turn_sessions), len(ev), grown_cutoff(docs, k)))
    return out


def _put(out: dict[str, float], level: str, k: int, scores: tuple[float, float, float]) -> None:
    for name, value in zip((RECALL_ANY, RECALL_ALL, NDCG_ANY), scores):
        out[f"{level}_{name}@{k}"] = value


def score_questions(ranked_turns: Sequence[Sequence[str]], ranked_sessions: Sequence[Sequence[str]],
                    evidence: Sequence[Sequence[str]], evidence_turn_sessions: Sequence[Sequence[str]],
                    answer_sessions: Sequence[Iterable[str]]) -> dict[str, np.ndarray]:
    """:func:`score_question` over questions: ``{"lme_turn_recall_all@5": array(n), ...}``."""
    rows = [score_question(*args) for args in zip(ranked_turns, ranked_sessions, evidence, evidence_turn_sessions,
                                                  answer_sessions)]
    keys = [f"{p}@{k}" for p in names() for k in (TURN_KS if p.startswith(LME_TURN) else SESSION_KS)]
    return {key: np.array([r[key] for r in rows], dtype=np.float64) for key in keys}
