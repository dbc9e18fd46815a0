"""``personalai``: PersonalAI graph traversals over entity / fact / triplet structure.

Start nodes: the ``start_entities`` entity nodes nearest the query (by description), plus
the ``start_turns`` turn nodes nearest it (PersonalAI's episodic vertices as starts, memlib's
addition: memlib mines only people's turns for entities (``gate.extract_roles``), so an
assistant's reply is linked to no entity and no traversal from entities reaches it; chosen
by cross-validation over locomo_dev3 and longmemeval_s_dev24 among 0, 3, 5, 8, 12,
docs/decisions/0020-personalai-turn-starts.md).
Evidence nodes: ``evidence_kinds`` (turns, facts, triplets, events) reached by
* WaterCircles — BFS rings from each start entity (``circles`` deep); a node reached from
  several start entities (an intersection) scores (#entities reaching it) + cosine, others
  cosine / 2;
* A* — best-first from the start entities with f = g + h, g = ``step_cost`` · depth,
  h = 1 − ⟨q, v⟩ (inner-product heuristic), depth ≤ ``astar_depth`` (10), ≤ ``astar_nodes``
  (150) expanded; a node scores 1 / (1 + f);
* BeamSearch — ``beam_paths`` (10) paths extended ``beam_depth`` (5) times, a path scored
  by the mean cosine of its nodes; a node scores its best path's score.
``method`` picks one traversal or ``union`` (RRF of the three, default).
"""
from __future__ import annotations

import heapq
from enum import Enum
from typing import Any

import numpy as np

from memlib.retrieve import kernels
from memlib.retrieve.base import RetrievedNode, StrategyBase
from memlib.retrieve.graphview import GraphView, graph_view, query_vector
from memlib.retrieve.registry import register


class Method(str, Enum):
    WATER = "water"
    ASTAR = "astar"
    BEAM = "beam"
    UNION = "union"


def water_circles(view: GraphView, starts: list[int], sims: np.ndarray, circles: int) -> dict[int, float]:
    reach: dict[int, set[int]] = {}
    for s in starts:
        seen, ring = {s}, [s]
        for _ in range(circles):
            nxt = [int(v) for u in ring for v in view.neighbours(u)[0].tolist() if v not in seen]
            seen.update(nxt)
            ring = list(dict.fromkeys(nxt))
        for v in seen:
            reach.setdefault(v, set()).add(s)
    return {v: (len(src) + float(sims[v])) if len(src) > 1 else float(sims[v]) / 2 for v, src in reach.items()}


def astar(view: GraphView, starts: list[int], sims: np.ndarray, max_depth: int, max_nodes: int,
          step_cost: float) -> dict[int, float]:
    heap = [(1.0 - float(sims[s]), 0, s) for s in starts]
    heapq.heapify(heap)
    best: dict[int, float] = {}
    while heap and len(best) < max_nodes:
        f, depth, u = heapq.heappop(heap)
        if u in best:
            continue
        best[u] = 1.0 / (1.0 + f)
        if depth >= max_depth:
            continue
        for v in view.neighbours(u)[0].tolist():
            if v not in best:
                heapq.heappush(heap, (step_cost * (depth + 1) + 1.0 - float(sims[v]), depth + 1, v))
    return best


def beam_search(view: GraphView, starts: list[int], sims: np.ndarray, depth: int, paths: int) -> dict[int, float]:
    beam = [((float(sims[s]),), (s,)) for s in starts]
    best: dict[int, float] = {}
    for _ in range(depth):
        grown = []
        for path_sims, path in beam:
            for v in view.neighbours(path[-1])[0].tolist():
                if v not in path:
                    grown.append((path_sims + (float(sims[v]),), path + (v,)))
        if not grown:
            break
        grown.sort(key=lambda x: -float(np.mean(x[0])))
        beam = grown[:paths]
        for path_sims, path in beam:
            score = float(np.mean(path_sims))
            for v in path:
                best[v] = max(best.get(v, 0.0), score)
    return best


@register("personalai")
class PersonalAI(StrategyBase):
    defaults = {"method": Method.UNION.value, "start_entities": 5, "start_turns": 5, "circles": 2, "astar_depth": 10,
                "astar_nodes": 150, "step_cost": 0.05, "beam_depth": 5, "beam_paths": 10,
                "evidence_kinds": ["turn", "fact", "triplet", "event"], "rrf_k": kernels.RRF_K}

    def search(self, tenant, query: str, k: int, **params: Any) -> list[RetrievedNode]:
        p = self.call_params(params)
        qvec = query_vector(tenant, query)
        view = graph_view(tenant)
        starts_ids = [nid for nid, _ in kernels.knn(tenant, qvec, int(p["start_entities"]), ["entity"])]
        if starts_ids and int(p["start_turns"]) > 0:
            starts_ids += [nid for nid, _ in kernels.knn(tenant, qvec, int(p["start_turns"]), ["turn"])]
        if view is None or not starts_ids:
            return kernels.make_nodes(tenant, kernels.knn(tenant, qvec, k, ["turn"]), score_name="sim")
        starts = [int(v) for v in view.graph.vertices(starts_ids) if v >= 0]
        sims = np.clip(view.sims(qvec), 0.0, None)
        runs = self._runs(view, starts, sims, p)
        evidence = np.isin(view.kinds, list(p["evidence_kinds"]))
        rankings = {m: [(str(view.graph.ids[v]), s) for v, s in sorted(r.items(), key=lambda kv: -kv[1]) if evidence[v]]
                    for m, r in runs.items()}
        ranking = (kernels.rrf(list(rankings.values()), k=int(p["rrf_k"])) if len(rankings) > 1
                   else next(iter(rankings.values())))[:k]
        signals = {nid: {f"{m}_rank": float(next((i for i, (n, _) in enumerate(r, 1) if n == nid), 0))
                         for m, r in rankings.items()} for nid, _ in ranking}
        return kernels.make_nodes(tenant, ranking, signals, score_name="personalai")

    @staticmethod
    def _runs(view: GraphView, starts: list[int], sims: np.ndarray, p: dict[str, Any]) -> dict[str, dict[int, float]]:
        method = Method(p["method"])
        todo = [Method.WATER, Method.ASTAR, Method.BEAM] if method is Method.UNION else [method]
        out = {}
        for m in todo:
            if m is Method.WATER:
                out[m.value] = water_circles(view, starts, sims, int(p["circles"]))
            elif m is Method.ASTAR:
                out[m.value] = astar(view, starts, sims, int(p["astar_depth"]), int(p["astar_nodes"]),
                                     float(p["step_cost"]))
            else:
                out[m.value] = beam_search(view, starts, sims, int(p["beam_depth"]), int(p["beam_paths"]))
        return out
