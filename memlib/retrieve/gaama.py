"""``gaama``: GAAMA retrieval over episodes (turns), facts, reflections and concepts.

1. kNN pool of ``pool_factor`` × (sum of budgets) nodes of ``kinds``; the top ``seeds`` are
   PPR seeds weighted sim².
2. Depth-``depth`` expansion of the seeds (capped at ``max_nodes``) and edge-type-aware PPR
   with hub dampening on that subgraph (memlib.graph.variants.gaama_ppr_scores, α and edge
   weights from cfg.graph).
3. score = ``ppr_weight``·ppr + ``sim_weight``·sim, each max-normalized over the subgraph.
4. Per-type budgets (facts 60, reflections 20, episodes 80) keep the best of each kind; the
   ranked list interleaves them by score. :func:`gaama_context` packs them in GAAMA's order
   (facts, reflections, then episodes in time order) within ``word_budget`` words.
Without a tenant graph, or without a seed of positive similarity, the ranking is the kNN pool
itself (sim only).
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import numpy as np

from memlib.config import GraphConfig
from memlib.graph.subgraph import subgraph
from memlib.retrieve import kernels
from memlib.retrieve.base import RetrievedNode, StrategyBase
from memlib.retrieve.graphview import graph_view, query_vector
from memlib.retrieve.registry import register
from memlib.schema import NodeKind

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
BUDGET_KINDS = {NodeKind.FACT.value: "fact_budget", NodeKind.REFLECTION.value: "reflection_budget",
                NodeKind.TURN.value: "episode_budget"}


@register("gaama")
class Gaama(StrategyBase):
    wants_config = True
    defaults = {"kinds": ["turn", "fact", "reflection", "concept"], "pool_factor": 2, "seeds": 40,
                "depth": 2, "max_nodes": 3000, "ppr_weight": 0.1, "sim_weight": 1.0,
                "fact_budget": 60, "reflection_budget": 20, "episode_budget": 80, "word_budget": 1000}

    def __init__(self, params: dict[str, Any] | None = None, cfg: Any = None):
        super().__init__(params)
        self.graph_cfg = cfg.graph if cfg is not None else GraphConfig()

    def search(self, tenant, query: str, k: int, **params: Any) -> list[RetrievedNode]:
        p = self.call_params(params)
        qvec = query_vector(tenant, query)
        budget = sum(int(p[b]) for b in BUDGET_KINDS.values())
        pool = kernels.knn(tenant, qvec, int(p["pool_factor"]) * budget, p["kinds"])
        view = graph_view(tenant, self.graph_cfg)
        seeds = {nid: max(s, 0.0) ** 2 for nid, s in pool[:int(p["seeds"])]}
        if view is None or not any(w > 0.0 for w in seeds.values()):
            # no graph, or no seed with a positive weight (an empty query's zero vector): the kNN pool
            return kernels.make_nodes(tenant, pool[:k], score_name="sim")
        sub = subgraph(view.graph, seeds, int(p["depth"]), int(p["max_nodes"]))
        ppr = view.gaama_ppr(seeds, sub)
        sims = np.clip(view.sims(qvec)[sub.parent_index], 0.0, None)
        sim_n = sims / max(float(sims.max(initial=0.0)), 1e-12)
        score = float(p["ppr_weight"]) * ppr + float(p["sim_weight"]) * sim_n
        ranked = self._budgeted(view.kinds[sub.parent_index], score, p)
        ids = sub.ids
        ranking = [(str(ids[i]), float(score[i])) for i in ranked][:max(k, 1) if k else 0]
        signals = {str(ids[i]): {"ppr": float(ppr[i]), "sim": float(sims[i])} for i in ranked[:len(ranking)]}
        return kernels.make_nodes(tenant, ranking, signals, score_name="gaama")

    @staticmethod
    def _budgeted(kinds: np.ndarray, score: np.ndarray, p: dict[str, Any]) -> np.ndarray:
        """Subgraph positions by score, each budgeted kind cut to its budget."""
        order = np.argsort(-score, kind="stable")
        keep = np.zeros(order.size, dtype=bool)
        for kind, key in BUDGET_KINDS.items():
            hit = np.flatnonzero(kinds[order] == kind)[:int(p[key])]
            keep[hit] = True
        return order[keep]


def gaama_context(tenant, nodes: list[RetrievedNode], word_budget: int = 1000) -> str:
    """GAAMA's packing order: facts, reflections, then episodes in time order."""
    rank = {NodeKind.FACT.value: 0, NodeKind.REFLECTION.value: 1, NodeKind.TURN.value: 2}
    ordered = sorted((n for n in nodes if n.kind in rank),
                     key=lambda n: (rank[n.kind], (min((t for t in n.times if t is not None), default=None)
                                                   or _EPOCH) if n.kind == NodeKind.TURN.value else _EPOCH))
    return kernels.pack_context(tenant, ordered, word_budget)

