"""Local personalized PageRank by forward push (Andersen, Chung and Lang, "Local graph partitioning
using PageRank vectors", FOCS 2006), on the same model as :mod:`memlib.graph.ppr`:
``x = d·P'ᵀx + (1-d)·v`` (``P'``: sink rows replaced by the teleport ``v``).

Each vertex holds an estimate ``p`` and a residual ``r`` (``r = v`` at the start). Pushing ``u``
moves ``(1-d)·r_u`` into ``p_u`` and spreads ``d·r_u`` over ``u``'s transitions (over ``v`` from a
sink), so ``x = p + Σ_u r_u · ppr(e_u)`` holds throughout: the exact vector differs from ``p`` by at
most the residual left, in L1 (every ``ppr(e_u)`` sums to 1). A vertex is pushed while its residual
exceeds ``eps`` times its degree (at least 1), so the work is bounded by ``1 / ((1-d)·eps)`` transitions
read, whatever the graph's size: a query on a 108,000-vertex haystack graph touches the seeds'
surroundings, not the graph (docs/decisions/0039-local-memory-signals.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from memlib.graph.ppr import Transition

_JIT = {"cache": True, "nogil": True}


@dataclass(frozen=True)
class PushResult:
    scores: np.ndarray  # the estimate p, one entry per vertex (0 where no mass arrived)
    residual: float  # L1 mass not yet pushed: ‖x - p‖₁ ≤ residual
    pushes: int  # vertices pushed
    reads: int  # transitions read


@nb.njit(**_JIT)
def _push(indptr, nbr, prob, sink, seeds, weights, damping, eps):
    n = indptr.size - 1
    p = np.zeros(n)
    r = np.zeros(n)
    queued = np.zeros(n, np.bool_)
    ring = np.empty(n, np.int64)  # FIFO: a vertex is in it at most once
    head = 0
    size = 0
    for i in range(seeds.size):
        r[seeds[i]] += weights[i]
    for i in range(seeds.size):
        s = seeds[i]
        if not queued[s] and r[s] > eps * max(indptr[s + 1] - indptr[s], 1):
            queued[s] = True
            ring[(head + size) % n] = s
            size += 1
    pushes = 0
    reads = 0
    while size > 0:
        u = ring[head]
        head = (head + 1) % n
        size -= 1
        queued[u] = False
        ru = r[u]
        r[u] = 0.0
        p[u] += (1.0 - damping) * ru
        m = damping * ru
        pushes += 1
        if sink[u]:  # a sink's mass goes back to the teleport vector
            for i in range(seeds.size):
                s = seeds[i]
                r[s] += m * weights[i]
                if not queued[s] and r[s] > eps * max(indptr[s + 1] - indptr[s], 1):
                    queued[s] = True
                    ring[(head + size) % n] = s
                    size += 1
            continue
        for k in range(indptr[u], indptr[u + 1]):
            v = nbr[k]
            r[v] += m * prob[k]
            if not queued[v] and r[v] > eps * max(indptr[v + 1] - indptr[v], 1):
                queued[v] = True
                ring[(head + size) % n] = v
                size += 1
        reads += indptr[u + 1] - indptr[u]
    return p, r.sum(), pushes, reads


def push_ppr(indptr: np.ndarray, tr: Transition, vertices: np.ndarray, weights: np.ndarray, damping: float,
             eps: float) -> PushResult:
    """Forward-push PPR over ``tr`` (its transitions ``tr.prob`` at the adjacency slots ``indptr`` /
    ``tr.cols``, grouped by source) from the teleport ``vertices`` / ``weights`` (normalized here;
    vertices < 0 are ignored). Raises ``ValueError`` without a positive seed."""
    if not 0.0 <= damping < 1.0:
        raise ValueError(f"damping must be in [0, 1), got {damping}")
    vertices = np.asarray(vertices, dtype=np.int64)
    w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)
    ok = vertices >= 0
    vertices, w = vertices[ok], w[ok]
    if not w.sum() > 0:
        raise ValueError("personalized PageRank needs at least one seed in the graph with a positive weight")
    p, residual, pushes, reads = _push(np.asarray(indptr, dtype=np.int64), np.asarray(tr.cols, dtype=np.int64),
                                       np.asarray(tr.prob, dtype=np.float64), np.asarray(tr.sink, dtype=np.bool_),
                                       vertices, w / w.sum(), float(damping), float(eps))
    return PushResult(scores=p, residual=float(residual), pushes=int(pushes), reads=int(reads))
