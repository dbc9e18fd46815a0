"""PPR variants of the five method sources, over a :class:`MemoryGraph` (usually a query
subgraph from :func:`memlib.graph.subgraph.subgraph`). Each returns ``{node_id: score}``
for vertices with a positive score; the ``*_scores`` forms return arrays aligned with
``graph.ids`` for callers that stay vectorized.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from memlib.config import GraphConfig
from memlib.graph.model import MemoryGraph, scores_to_dict
from memlib.graph.ppr import (
    DEFAULT_KERNEL,
    Kernel,
    Transition,
    hub_factor,
    run_kernel,
    teleport_vector,
    transition_matrix,
)
from memlib.schema import NodeKind

DEFAULT_EDGE_WEIGHT = 0.5  # kinds missing from cfg.edge_weights


def seed_teleport(graph: MemoryGraph, seeds: Mapping[str, float]) -> np.ndarray:
    """Teleport vector from ``{node_id: weight}``; ids not in the graph are ignored."""
    verts = graph.vertices(seeds.keys())
    return teleport_vector(graph.num_nodes, verts, np.fromiter(seeds.values(), dtype=np.float64, count=len(seeds)))


# -- GAAMA ---------------------------------------------------------------------------------
def gaama_transition(graph: MemoryGraph, cfg: GraphConfig) -> Transition:
    """Edge-type weights × stored edge weight, hub-dampened by the *target's* degree
    (deg > hub → × hub/deg), normalized per source. Dampening the target is what lowers a
    hub's pass-through: per-source normalization would cancel a factor on the hub's own
    out-edges. Cached per (weights, hub degree) on the graph."""
    key = transition_key(cfg)

    def make() -> Transition:
        adj = graph.adjacency()
        base = graph.edge_kind_vector(cfg.edge_weights, DEFAULT_EDGE_WEIGHT) * graph.weight
        damp = hub_factor(graph.degree, cfg.hub_degree)
        return transition_matrix(adj, base[adj.eid] * damp[adj.nbr])
    return graph.cached(key, make)


def transition_key(cfg: GraphConfig) -> tuple:
    """The key :func:`gaama_transition` caches its transition under on a graph."""
    return ("gaama", tuple(sorted(cfg.edge_weights.items())), cfg.hub_degree)


def gaama_ppr_scores(graph: MemoryGraph, seeds: Mapping[str, float], cfg: GraphConfig,
                     kernel: Kernel = DEFAULT_KERNEL) -> np.ndarray:
    res = run_kernel(gaama_transition(graph, cfg), seed_teleport(graph, seeds), cfg.damping, cfg.tol,
                     cfg.max_iter, kernel)
    top = res.scores.max(initial=0.0)
    return res.scores / top if top > 0 else res.scores


def gaama_ppr(graph: MemoryGraph, seeds: Mapping[str, float], cfg: GraphConfig) -> dict[str, float]:
    """GAAMA edge-type-aware PPR with hub dampening; scores max-normalized to [0, 1]."""
    return scores_to_dict(graph, gaama_ppr_scores(graph, seeds, cfg))


# -- MemORAI -------------------------------------------------------------------------------
@dataclass(frozen=True)
class DwprFactors:
    """The query-time factors of a DWPR traversal, each left out as 1: ``edge[e]`` per stored edge
    (e.g. cosine(query, relation description)), ``target[v]`` per vertex entered (e.g.
    cosine(query, entity/segment description)), ``kind[k]`` per edge kind (missing kinds 1)."""

    edge: np.ndarray | None = None
    target: np.ndarray | None = None
    kind: Mapping[str, float] | None = None


def dwpr_scores(graph: MemoryGraph, seeds: Mapping[str, float], factors: DwprFactors = DwprFactors(), *,
                damping: float = 0.85, tol: float = 1e-6, max_iter: int = 200) -> np.ndarray:
    """MemORAI Dynamic Weighted PageRank. Traversal weight of ``u→v`` over edge ``e`` is the
    product of the ``factors`` given: ``edge[e]``, ``target[v]`` and ``kind[kind(e)]``. Negative
    cosines clip to 0. Seeds are the query similarities. Returns raw PPR mass (sums to 1)."""
    w = np.ones(graph.num_edges)
    if factors.edge is not None:
        w = w * _checked(factors.edge, graph.num_edges, "edge factors")
    if factors.kind is not None:
        w = w * graph.edge_kind_vector(dict(factors.kind), 1.0)
    adj = graph.adjacency()
    slot_w = w[adj.eid]
    if factors.target is not None:
        slot_w = slot_w * _checked(factors.target, graph.num_nodes, "target factors")[adj.nbr]
    tr = transition_matrix(adj, slot_w)
    return run_kernel(tr, seed_teleport(graph, seeds), damping, tol, max_iter).scores


def _checked(values: np.ndarray, size: int, name: str) -> np.ndarray:
    arr = np.clip(np.asarray(values, dtype=np.float64), 0.0, None)
    if arr.shape != (size,):
        raise ValueError(f"{name} must have shape ({size},), got {arr.shape}")
    return arr


# -- AssoMem -------------------------------------------------------------------------------
def assomem_scores(graph: MemoryGraph, turn_sims: Mapping[str, float], *, damping: float = 0.85,
                   tol: float = 1e-6, max_iter: int = 200) -> np.ndarray:
    """AssoMem importance: PPR over the stored edge weights with teleport = sim(query, turn)
    on turn vertices and 0 elsewhere (clue and other ids in ``turn_sims`` are ignored)."""
    verts = graph.vertices(turn_sims.keys())
    sims = np.fromiter(turn_sims.values(), dtype=np.float64, count=len(turn_sims))
    turn = graph.kind_mask(NodeKind.TURN)
    ok = verts >= 0
    sims = np.where(ok & turn[np.where(ok, verts, 0)], sims, 0.0)
    key = ("stored_weights",)
    tr = graph.cached(key, lambda: transition_matrix(graph.adjacency(), graph.weight[graph.adjacency().eid]))
    return run_kernel(tr, teleport_vector(graph.num_nodes, verts, sims), damping, tol, max_iter).scores


def assomem_importance(graph: MemoryGraph, turn_sims: Mapping[str, float], *, damping: float = 0.85,
                       tol: float = 1e-6, max_iter: int = 200) -> dict[str, float]:
    return scores_to_dict(graph, assomem_scores(graph, turn_sims, damping=damping, tol=tol, max_iter=max_iter))
