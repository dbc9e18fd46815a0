"""``memorai``: MemORAI multi-aspect seeds + Dynamic Weighted PageRank.

1. Seeds by aspect: segments by summary, entities by description, relations by triplet
   text — the top ``per_aspect`` of each by cosine, seed weight = cosine.
2. The seeds' ``depth``-hop (1) query subgraph.
3. DW-PR on it with query-conditioned weights: entering node v costs cosine(q, v) (entity
   descriptions, segment summaries, triplet texts, turns), damping ``damping``.
4. Turns ranked by ``ppr_weight``·DW-PR + ``sim_weight``·cosine (both max-normalized: the
   graph augments similarity, it does not replace it), followed by the triplets citing them.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from memlib.graph.subgraph import subgraph
from memlib.graph.variants import DwprFactors, dwpr_scores
from memlib.retrieve import kernels
from memlib.retrieve.base import RetrievedNode, StrategyBase
from memlib.retrieve.graphview import graph_view, query_vector
from memlib.retrieve.registry import register
from memlib.retrieve.signals import minmax

ASPECTS = ("segment", "entity", "triplet")


@register("memorai")
class MemORAI(StrategyBase):
    defaults = {"per_aspect": 8, "depth": 1, "max_nodes": 2000, "damping": 0.85, "ppr_weight": 0.3,
                "sim_weight": 1.0, "triplets_per_turn": 2}

    def search(self, tenant, query: str, k: int, **params: Any) -> list[RetrievedNode]:
        p = self.call_params(params)
        qvec = query_vector(tenant, query)
        seeds = {nid: max(s, 1e-6) for a in ASPECTS for nid, s in kernels.knn(tenant, qvec, int(p["per_aspect"]), [a])}
        view = graph_view(tenant)
        if view is None or not seeds:
            return kernels.make_nodes(tenant, kernels.knn(tenant, qvec, k, ["turn"]), score_name="sim")
        sub = subgraph(view.graph, seeds, int(p["depth"]), int(p["max_nodes"]))
        sims = np.clip(view.sims(qvec)[sub.parent_index], 0.0, None)
        ppr = dwpr_scores(sub, seeds, DwprFactors(target=sims + 1e-6), damping=float(p["damping"]))
        turn = view.is_turn[sub.parent_index]
        score = float(p["ppr_weight"]) * minmax(ppr) + float(p["sim_weight"]) * minmax(sims)
        pos = np.flatnonzero(turn)
        pos = pos[np.argsort(-score[pos], kind="stable")][:k]
        ranking = [(str(sub.ids[i]), float(score[i])) for i in pos]
        signals = {str(sub.ids[i]): {"dwpr": float(ppr[i]), "sim": float(sims[i])} for i in pos}
        turns = kernels.make_nodes(tenant, ranking, signals, score_name="memorai")
        return turns + citing_triplets(tenant, [n.node_id for n in turns], int(p["triplets_per_turn"]))


def citing_triplets(tenant, turn_ids: list[str], per_turn: int) -> list[RetrievedNode]:
    """Triplet nodes whose provenance cites the given turns, in turn order."""
    cites = _triplets_by_turn(tenant)
    ranking, seen = [], set()
    for rank, tid in enumerate(turn_ids):
        for nid in cites.get(tid, [])[:per_turn]:
            if nid not in seen:
                seen.add(nid)
                ranking.append((nid, 1.0 / (rank + 2)))
    return kernels.make_nodes(tenant, ranking, score_name="cites_rank")


def _triplets_by_turn(tenant) -> dict[str, list[str]]:
    def build() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for row in tenant.rows_of_kind(["triplet"]).tolist():
            for t in tenant.provenance[row]:
                out.setdefault(t, []).append(tenant.node_ids[row])
        return out

    return tenant.memo("triplets_by_turn", build)
