"""``assomem``: AssoMem clue-driven retrieval with CMI-weighted fusion.

1. Top ``clues`` clue nodes by cosine; candidates = the turns those clues own (plus the
   ``extra_turns`` nearest turns, so a missed clue does not empty the pool).
2. Signals per candidate: relevance = cosine(q, turn); importance = PPR over stored edge
   weights with teleport = relevance on turns (0 on clues), on the clues+candidates
   subgraph; temporal = 1 when the turn's session time falls in a window resolved from the
   question's temporal expressions, decaying with distance in days (0 without one).
3. Each signal min-max normalized over the candidates; fused with weights of the
   question's type (the intent router's class) from memlib/retrieve/fitted/assomem.json
   (softmax(CMI/T), fitted by ``memlib fit-assomem``) or the documented fallback
   relevance 0.6 / importance 0.25 / temporal 0.15.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from memlib.graph.subgraph import subgraph
from memlib.graph.variants import assomem_scores
from memlib.retrieve import cmi, kernels
from memlib.retrieve.base import RetrievedNode, StrategyBase
from memlib.retrieve.graphview import graph_view, query_vector
from memlib.retrieve.intent import route, time_windows
from memlib.retrieve.registry import register
from memlib.retrieve.signals import minmax

DAY_S = 86400.0


def candidate_signals(tenant, query: str, p: dict[str, Any]) -> tuple[list[str], dict[str, np.ndarray]]:
    """Candidate turn ids and their raw signals (relevance, importance, temporal)."""
    qvec = query_vector(tenant, query)
    clues = kernels.knn(tenant, qvec, int(p["clues"]), ["clue"])
    cand = list(dict.fromkeys([t for nid, _ in clues for t in tenant.turns_of(nid)] +
                              [nid for nid, _ in kernels.knn(tenant, qvec, int(p["extra_turns"]), ["turn"])]))
    rows = np.fromiter((tenant.row_of.get(t, -1) for t in cand), dtype=np.int64, count=len(cand))
    cand = [t for t, r in zip(cand, rows) if r >= 0]
    rows = rows[rows >= 0]
    q = qvec / max(float(np.linalg.norm(qvec)), 1e-12)
    rel = tenant.embeddings[rows] @ q if rows.size else np.zeros(0)
    return cand, {"relevance": rel, "importance": _importance(tenant, cand, rel, [c for c, _ in clues], p),
                  "temporal": _temporal(tenant, query, cand)}


def _importance(tenant, cand: list[str], rel: np.ndarray, clue_ids: list[str], p: dict[str, Any]) -> np.ndarray:
    view = graph_view(tenant)
    if view is None or not cand:
        return np.zeros(len(cand))
    sub = subgraph(view.graph, clue_ids + cand, 0, len(clue_ids) + len(cand))
    scores = assomem_scores(sub, dict(zip(cand, np.clip(rel, 1e-6, None).tolist())), damping=float(p["damping"]))
    verts = sub.vertices(cand)
    return np.where(verts >= 0, scores[np.maximum(verts, 0)], 0.0)


def _temporal(tenant, query: str, cand: list[str]) -> np.ndarray:
    latest = max((t.time for t in tenant.turns.values() if t.time is not None), default=None)
    windows = time_windows(query, latest)
    if not windows or not cand:
        return np.zeros(len(cand))
    times = [tenant.turns[t].time for t in cand]
    out = np.zeros(len(cand))
    for i, t in enumerate(times):
        if t is None:
            continue
        gaps = [0.0 if a <= t < b else min(abs((t - a).total_seconds()), abs((t - b).total_seconds())) / DAY_S
                for a, b in windows]
        out[i] = float(np.exp(-min(gaps) / 30.0))
    return out


@register("assomem")
class AssoMem(StrategyBase):
    defaults = {"clues": 3, "extra_turns": 30, "damping": 0.85, "weights_file": None}

    def __init__(self, params: dict[str, Any] | None = None):
        super().__init__(params)
        self.fitted = cmi.load_weights(self.params["weights_file"])

    def search(self, tenant, query: str, k: int, **params: Any) -> list[RetrievedNode]:
        p = self.call_params(params)
        cand, sig = candidate_signals(tenant, query, p)
        if not cand:
            return []
        qtype = route(query).value
        w = cmi.weights_for(self.fitted, qtype)
        norm = {s: minmax(v) for s, v in sig.items()}
        score = sum(float(w.get(s, 0.0)) * norm[s] for s in cmi.SIGNALS)
        top = np.argsort(-score, kind="stable")[:k]
        signals = {cand[i]: {**{s: float(sig[s][i]) for s in cmi.SIGNALS}, **{f"w_{s}": float(w.get(s, 0.0))
                                                                           for s in cmi.SIGNALS}} for i in top}
        return kernels.make_nodes(tenant, [(cand[i], float(score[i])) for i in top], signals, score_name="assomem")
