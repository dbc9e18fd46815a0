"""Personalized PageRank kernels.

Model (shared by every variant): a row-stochastic transition matrix ``P`` built from
non-negative traversal weights (each stored edge traversed both ways, rows normalized per
source); a teleport distribution ``v``; damping ``d`` = probability of following an edge.
The stationary vector solves ``x = d·P'ᵀx + (1-d)·v`` where ``P'`` replaces every sink row
(no positive out-weight) by ``v`` — i.e. mass that reaches a sink returns to the teleport
vector, as in GAAMA and graph-tool.

Kernels:

* :func:`personalized_pagerank` — power iteration on scipy sparse (``Pᵀ`` kept in CSR, so
  each step is one C-backed CSR matvec). The update ``x' = d·Pᵀx + (1 - ‖d·Pᵀx‖₁)·v`` puts
  the teleport *and* the sink mass back in one step, without a sink mask.
* :func:`gt_personalized_pagerank` — ``graph_tool.centrality.pagerank`` with ``pers`` and
  ``weight`` on a graph-tool graph carrying the same weights (same sink semantics).

Kernel choice, by measurement (``memlib bench ppr``, 20 queries, synthetic memory graphs
with ~4.7 edges/node, idle 2-core machine; docs/decisions/0022-ppr-kernel.md): per-query p50 scipy vs graph-tool =
0.44 vs 0.96 ms at 1k nodes, 3.0 vs 7.2 ms at 10k, 48 vs 262 ms at 100k, 0.90 s vs 5.0 s
at 1M; max |Δ| ≤ 4e-8. The cached ``Pᵀ`` is reused across queries while graph-tool's call
re-normalizes weights each time, so :data:`DEFAULT_KERNEL` is scipy at
every size; graph-tool's kernel stays as the reference and owns the build-time PageRank.
With graph-tool's default OpenMP pool on the busy machine its 1k-node call took ~440 ms
(spin-waiting); pin it with ``graph_tool.openmp_set_num_threads`` where cores are shared.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
import scipy.sparse as sp

from memlib.graph.model import Adjacency


class Kernel(str, Enum):
    SCIPY = "scipy"
    GRAPH_TOOL = "graph_tool"


DEFAULT_KERNEL = Kernel.SCIPY


@dataclass(frozen=True)
class Transition:
    """``pt`` = Pᵀ (CSR, float64) of a row-stochastic ``P``; ``sink`` marks rows without
    positive out-weight. ``rows``/``cols``/``prob`` list P's entries (parallel entries
    are kept separate; they add up in every product)."""

    pt: sp.csr_matrix
    sink: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    prob: np.ndarray

    @property
    def n(self) -> int:
        return int(self.pt.shape[0])


@dataclass(frozen=True)
class PPRResult:
    scores: np.ndarray
    iterations: int
    residual: float


def hub_factor(degree: np.ndarray, hub_degree: int | None) -> np.ndarray:
    """GAAMA hub dampening: 1 up to ``hub_degree``, ``hub_degree / deg`` above it."""
    deg = np.asarray(degree, dtype=np.float64)
    if hub_degree is None:
        return np.ones_like(deg)
    return np.where(deg > hub_degree, hub_degree / np.maximum(deg, 1.0), 1.0)


def transition_matrix(adj: Adjacency, slot_weight: np.ndarray) -> Transition:
    """Per-source normalized transitions from a symmetrized :class:`Adjacency`: slot ``i``
    (traversal ``u -> adj.nbr[i]``) carries ``slot_weight[i]``; non-positive weights give
    no transition. The slots are already grouped by source, so P is assembled in CSR
    without sorting and Pᵀ by scipy's linear-time CSR→CSC conversion."""
    n = adj.indptr.size - 1
    w = np.clip(np.asarray(slot_weight, dtype=np.float64), 0.0, None)
    rows = adj.rows()
    out = np.bincount(rows, weights=w, minlength=n)
    denom = out[rows]
    prob = np.divide(w, denom, out=np.zeros_like(w), where=denom > 0)
    p = sp.csr_matrix((prob, adj.nbr, adj.indptr), shape=(n, n))
    return Transition(pt=p.T.tocsr(), sink=out <= 0, rows=rows, cols=adj.nbr, prob=prob)


def teleport_vector(n: int, vertices: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Dense teleport distribution from (vertex, weight) pairs; negatives clip to 0,
    repeated vertices add up. Raises ``ValueError`` when no positive mass is left."""
    v = np.zeros(n, dtype=np.float64)
    ok = vertices >= 0
    np.add.at(v, vertices[ok], np.clip(np.asarray(weights, dtype=np.float64)[ok], 0.0, None))
    total = v.sum()
    if not total > 0:
        raise ValueError("personalized PageRank needs at least one seed in the graph with a positive weight")
    return v / total


def personalized_pagerank(pt: sp.csr_matrix, teleport: np.ndarray, damping: float,
                          tol: float = 1e-6, max_iter: int = 200) -> PPRResult:
    """Power iteration ``x' = d·Pᵀx + (1 - ‖d·Pᵀx‖₁)·v`` from ``x = v`` until the L1 change
    is below ``tol`` or ``max_iter`` steps. ``pt`` is Pᵀ in CSR; ``teleport`` sums to 1."""
    if not 0.0 <= damping < 1.0:
        raise ValueError(f"damping must be in [0, 1), got {damping}")
    v = np.asarray(teleport, dtype=np.float64)
    x = v.copy()
    residual = np.inf
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - read after the loop: the iterations run
        y = pt @ x
        y *= damping
        y += (1.0 - y.sum()) * v
        residual = float(np.abs(y - x).sum())
        x = y
        if residual < tol:
            break
    return PPRResult(scores=x, iterations=it, residual=residual)


def gt_transition_graph(tr: Transition):
    """A graph-tool graph whose edge weights are the transition probabilities of ``tr``
    (one edge per directed traversal), for :func:`gt_personalized_pagerank`."""
    import graph_tool as gt

    g = gt.Graph(directed=True)
    g.add_vertex(tr.n)
    g.add_edge_list(np.column_stack([tr.rows, tr.cols]))
    w = g.new_ep("double")
    w.a = tr.prob
    g.ep["weight"] = w
    return g


def gt_personalized_pagerank(g, teleport: np.ndarray, damping: float, tol: float = 1e-6,
                             max_iter: int = 200) -> PPRResult:
    """graph-tool's weighted personalized PageRank on a graph from :func:`gt_transition_graph`."""
    from graph_tool.centrality import pagerank

    pers = g.new_vp("double")
    pers.a = teleport
    prop, iters = pagerank(g, damping=damping, pers=pers, weight=g.ep["weight"], epsilon=tol,
                           max_iter=max_iter, ret_iter=True)
    return PPRResult(scores=prop.a.copy(), iterations=int(iters), residual=float("nan"))


def run_kernel(tr: Transition, teleport: np.ndarray, damping: float, tol: float, max_iter: int,
               kernel: Kernel = DEFAULT_KERNEL) -> PPRResult:
    if kernel is Kernel.GRAPH_TOOL:
        return gt_personalized_pagerank(gt_transition_graph(tr), teleport, damping, tol, max_iter)
    return personalized_pagerank(tr.pt, teleport, damping, tol, max_iter)


def openmp_threads(n: int | None = None) -> int:
    """graph-tool's OpenMP threads in this process: set to ``n`` when given; returns the count."""
    import graph_tool

    if n is not None:
        graph_tool.openmp_set_num_threads(n)
    return graph_tool.openmp_get_num_threads()
