"""``magma``: MAGMA intent-routed retrieval.

1. Route the question to an intent (WHY / WHEN / ENTITY / OTHER, memlib/retrieve/intent.py).
2. Anchors: RRF (k=60) over the vector top-``vector_k`` (20), keyword (Lance FTS) top-
   ``keyword_k`` and time-window hits (nodes whose time falls in a window resolved from
   the question's temporal expressions, best cosine first).
3. Beam traversal from the top ``anchors`` over the graph (depth ≤ ``max_depth`` 5, ≤
   ``max_nodes`` 200 visited): a step u→v over an edge of kind e scores
   ``score(u) · decay · exp(λ1·w_intent[e] + λ2·sim(q, v)) / exp(λ1·max w + λ2)``; the
   ``beam`` best candidates of each depth are kept.
4. Visited nodes ranked by score; run_search linearizes them with ids and timestamps.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from memlib.retrieve import kernels
from memlib.retrieve.base import RetrievedNode, StrategyBase
from memlib.retrieve.graphview import GraphView, graph_view, query_vector
from memlib.retrieve.intent import Intent, route, time_windows
from memlib.retrieve.registry import register

INTENT_EDGE_WEIGHTS: dict[str, dict[str, float]] = {
    Intent.WHY.value: {"CAUSES": 3.0, "NEXT": 1.5, "IN_SEGMENT": 1.0, "DERIVED_FROM": 1.0, "SIMILAR": 0.5},
    Intent.WHEN.value: {"NEXT": 2.0, "IN_SESSION": 1.5, "DERIVED_FROM": 1.0, "CAUSES": 0.5},
    Intent.ENTITY.value: {"MENTIONS": 3.0, "RELATION": 3.0, "DERIVED_FROM": 1.0, "SIMILAR": 0.5},
    Intent.OTHER.value: {"SIMILAR": 1.5, "DERIVED_FROM": 1.0, "HAS_CONCEPT": 1.0, "ABOUT_CONCEPT": 1.0,
                         "NEXT": 1.0},
}


@register("magma")
class Magma(StrategyBase):
    defaults = {"kinds": ["turn", "event", "fact"], "vector_k": 20, "keyword_k": 20, "time_k": 20,
                "rrf_k": kernels.RRF_K, "anchors": 10, "beam": 10, "max_depth": 5, "max_nodes": 200,
                "lambda1": 1.0, "lambda2": 2.0, "decay": 0.5, "default_edge_weight": 0.2,
                "edge_weights": INTENT_EDGE_WEIGHTS}

    def search(self, tenant, query: str, k: int, **params: Any) -> list[RetrievedNode]:
        p = self.call_params(params)
        intent = route(query)
        qvec = query_vector(tenant, query)
        vec = kernels.knn(tenant, qvec, int(p["vector_k"]), p["kinds"])
        lex = kernels.lance_fts(tenant, query, int(p["keyword_k"]), p["kinds"])
        tim = time_hits(tenant, query, qvec, int(p["time_k"]), p["kinds"])
        anchors = kernels.rrf([vec, lex, tim], k=int(p["rrf_k"]))
        top = max((s for _, s in anchors), default=1.0)
        anchors = [(nid, s / top) for nid, s in anchors]
        view = graph_view(tenant)
        scores = dict(anchors)
        if view is not None:
            scores = beam_traverse(view, qvec, anchors[:int(p["anchors"])], p, intent, scores)
        ranking = sorted(scores.items(), key=lambda kv: -kv[1])[:k]
        anchor_set = {nid for nid, _ in anchors}
        sig = {nid: {"anchor": float(nid in anchor_set), "intent_" + intent.value: 1.0} for nid, _ in ranking}
        return kernels.make_nodes(tenant, ranking, sig, score_name="magma")


def time_hits(tenant, query: str, qvec: np.ndarray, k: int, kinds: list[str]) -> kernels.Ranking:
    """Nodes of ``kinds`` whose time falls in a window of the question, by cosine."""
    latest = max((t.time for t in tenant.turns.values() if t.time is not None), default=None)
    windows = time_windows(query, latest)
    if not windows:
        return []
    rows = tenant.rows_of_kind(kinds)
    inside = np.array([any(a <= t < b for a, b in windows) if (t := tenant.times[r]) is not None else False
                       for r in rows], dtype=bool)
    rows = rows[inside]
    sims = tenant.embeddings[rows] @ (qvec / max(float(np.linalg.norm(qvec)), 1e-12))
    order = np.argsort(-sims, kind="stable")[:k]
    return [(tenant.node_ids[rows[i]], float(sims[i])) for i in order]


def beam_traverse(view: GraphView, qvec: np.ndarray, anchors: kernels.Ranking, p: dict[str, Any], intent: Intent,
                  scores: dict[str, float]) -> dict[str, float]:
    """Beam search from the anchors; returns ``scores`` updated with the visited nodes."""
    table = dict(p["edge_weights"].get(intent.value, {}))
    w_code = view.edge_kind_codes(table, float(p["default_edge_weight"]))
    l1, l2, decay = float(p["lambda1"]), float(p["lambda2"]), float(p["decay"])
    norm = math.exp(l1 * float(w_code.max(initial=0.0)) + l2)
    sims = view.sims(qvec)
    verts = view.graph.vertices([nid for nid, _ in anchors])
    best = {int(v): s for v, (_, s) in zip(verts, anchors) if v >= 0}
    frontier = dict(best)
    for _ in range(int(p["max_depth"])):
        cand: dict[int, float] = {}
        for u, su in frontier.items():
            nbr, codes = view.neighbours(u)
            step = su * decay * np.exp(l1 * w_code[codes] + l2 * sims[nbr]) / norm
            for v, s in zip(nbr.tolist(), step.tolist()):
                if s > cand.get(v, 0.0) and s > best.get(v, 0.0):
                    cand[v] = s
        if not cand:
            break
        room = int(p["max_nodes"]) - len(best)
        if room <= 0:
            break
        frontier = dict(sorted(cand.items(), key=lambda kv: -kv[1])[:min(int(p["beam"]), room)])
        best.update(frontier)
    ids = view.graph.ids
    for v, s in best.items():
        nid = str(ids[v])
        if s > scores.get(nid, 0.0):
            scores[nid] = s
    return scores
