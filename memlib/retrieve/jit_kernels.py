"""Compiled loops of ``auto``'s first stage (memlib/retrieve/first_stage.py), with numba.

On a 2,500-session tenant the first stage was a few hundred numpy calls per query over arrays
of the tenant's size (26k turns, 21k token ids) and of the candidates' rows (13k), some of them
scans whose branches the CPU cannot predict. These loops do the same arithmetic in one pass
each and give the same results as the numpy code they replaced, bit for bit (that code is the
reference in tests/retrieve/test_first_stage.py):

* :func:`reach_scan`: the ids each query token reaches;
* :func:`walk_postings`: the approximate MaxSim over the reached ids' postings;
* :func:`split_reached` and :func:`top_positions`: the reached turns split by role, and the best
  of each;
* :func:`vocab_major`, :func:`far_rows` and :func:`fold_rows`: the candidates' per-token maxima,
  far rows by their id's centroid cosine read from a token-major copy of the cosines (one cache
  line per row instead of one per query token), near rows by onnxruntime's int8 product.

Compiled once per machine (``cache=True``: numba's cache beside this file, or in the user's
cache directory when that is not writable); :func:`warm` compiles them before a tenant's first
query.
"""
from __future__ import annotations

import numba as nb
import numpy as np

_JIT = {"cache": True, "nogil": True}


@nb.njit(**_JIT)
def walk_postings(sim, reach_ids, reach_cut, ptr, turns, weights, n_turns):
    """Per turn: ``sum_q weights[q] * max sim[q, id]`` over the ids reached by query token ``q``
    (``reach_ids[reach_cut[q]:reach_cut[q + 1]]``) whose postings (``turns[ptr[id]:ptr[id + 1]]``)
    hold the turn; 0 for a turn no token reaches. A token's ids are walked by falling cosine, so
    the first time a turn is met is its maximum for that token."""
    score = np.zeros(n_turns, np.float32)
    stamp = np.full(n_turns, -1, np.int32)
    for q in range(reach_cut.size - 1):
        ids = reach_ids[reach_cut[q]:reach_cut[q + 1]]
        vals = np.empty(ids.size, np.float32)
        for i in range(ids.size):
            x = sim[q, ids[i]]
            vals[i] = x if x > 0 else np.float32(0.0)  # a turn's best starts at 0, as in the definition
        order = np.argsort(-vals, kind="mergesort")
        w = weights[q]
        for oi in range(order.size):
            v = ids[order[oi]]
            val = vals[order[oi]]
            for p in range(ptr[v], ptr[v + 1]):
                t = turns[p]
                score[t] += w * val * np.float32(stamp[t] != q)  # adds 0.0 (no change) after the first
                stamp[t] = q
    return score


@nb.njit(**_JIT)
def split_reached(score, assistant):
    """(positions of turns with a positive score that are not an assistant's, positions of those
    that are), each ascending. Without branches on the data: which turns are reached follows no
    pattern the CPU can predict, and a branch per turn cost more than the scan (150 against 17 us
    on 26k turns, measured one query at a time)."""
    n_other = 0
    n_asst = 0
    for t in range(score.size):
        reached = score[t] > 0
        n_other += reached & ~assistant[t]
        n_asst += reached & assistant[t]
    other = np.empty(n_other + 1, np.int64)  # one slot more: every turn is written, the cursor moves on a hit
    asst = np.empty(n_asst + 1, np.int64)
    i = 0
    j = 0
    for t in range(score.size):
        reached = score[t] > 0
        other[i] = t
        asst[j] = t
        i += reached & ~assistant[t]
        j += reached & assistant[t]
    return other[:n_other], asst[:n_asst]


@nb.njit(**_JIT)
def reach_scan(sim, followed, min_cos, expand):
    """(ids, cut): per query token ``q`` (``ids[cut[q]:cut[q + 1]]``) the ids it reaches: cosine
    at least ``min_cos``, ``followed``, and of those the ``expand`` best by falling cosine, the
    lower id first among equal cosines."""
    n_q, n_v = sim.shape
    ids = np.empty(n_q * expand, np.int64)
    cut = np.zeros(n_q + 1, np.int64)
    hits = np.empty(n_v, np.int64)
    n = 0
    for q in range(n_q):
        n_hits = 0
        for v in range(n_v):
            if sim[q, v] >= min_cos:  # rare (a few dozen ids of thousands): a well-predicted branch
                hits[n_hits] = v
                n_hits += followed[v]
        if n_hits > expand:
            vals = np.empty(n_hits, np.float32)
            for i in range(n_hits):
                vals[i] = -sim[q, hits[i]]
            order = np.argsort(vals, kind="mergesort")[:expand]
            for i in range(expand):
                ids[n + i] = hits[order[i]]
            n += expand
        else:
            ids[n:n + n_hits] = hits[:n_hits]
            n += n_hits
        cut[q + 1] = n
    return ids[:n], cut


@nb.njit(**_JIT)
def top_positions(scores, positions, n):
    """The ``n`` of ``positions`` (ascending) with the best ``scores``, ascending; of equal scores
    at the cut the first positions. A bounded
    heap whose root is the worst kept (lowest score, then last position): after the first few
    thousand turns a new one rarely beats it, so the one comparison per turn is predicted."""
    if n <= 0:
        return np.zeros(0, np.int64)
    if n >= positions.size:
        return positions.copy()
    heap = positions[:n].copy()
    # heapify; a is worse than b: lower score, or equal score and later position
    for start in range(n // 2 - 1, -1, -1):
        _sift(heap, scores, start, n)
    for i in range(n, positions.size):
        t = positions[i]
        if scores[t] > scores[heap[0]]:  # equal score: t comes later, so it is not better
            heap[0] = t
            _sift(heap, scores, 0, n)
    return np.sort(heap)


@nb.njit(**_JIT)
def _sift(heap, scores, i, n):
    while True:
        worst = i
        for child in (2 * i + 1, 2 * i + 2):
            if child < n:
                a, b = heap[child], heap[worst]
                if scores[a] < scores[b] or (scores[a] == scores[b] and a > b):
                    worst = child
        if worst == i:
            return
        heap[i], heap[worst] = heap[worst], heap[i]
        i = worst


@nb.njit(**_JIT)
def vocab_major(sim):
    """(sim.T as a contiguous (V, Q) array, per id its best cosine over the query tokens)."""
    n_q, n_v = sim.shape
    out = np.empty((n_v, n_q), np.float32)
    best = np.empty(n_v, np.float32)
    for v in range(n_v):
        m = sim[0, v]
        for q in range(n_q):
            x = sim[q, v]
            out[v, q] = x
            m = x if x > m else m
        best[v] = m
    return out, best


@nb.njit(**_JIT)
def far_rows(turns, bounds, row_vocab, sim_t, vocab_best, min_cos):
    """The candidates' MaxSim, first pass: (best, near, owner). ``best`` (Q, len(turns)) holds per
    query token and turn the best centroid cosine (``sim_t``, token-major) over the turn's far
    rows, those whose id no query token reaches with ``min_cos`` (``vocab_best``), -inf where
    there are none; ``near`` lists the other rows, which need their own vectors, and ``owner``
    the position in ``turns`` of each. :func:`fold_rows` then adds the near rows' cosines."""
    n_q = sim_t.shape[1]
    best = np.full((n_q, turns.size), -np.inf, np.float32)
    n_rows = 0
    for i in range(turns.size):
        n_rows += bounds[turns[i] + 1] - bounds[turns[i]]
    near = np.empty(n_rows, np.int64)
    owner = np.empty(n_rows, np.int64)
    n_near = 0
    for i in range(turns.size):
        for r in range(bounds[turns[i]], bounds[turns[i] + 1]):
            v = row_vocab[r]
            if vocab_best[v] >= min_cos:
                near[n_near] = r
                owner[n_near] = i
                n_near += 1
            else:
                for q in range(n_q):
                    x = sim_t[v, q]
                    cur = best[q, i]
                    best[q, i] = x if x > cur else cur
    return best, near[:n_near], owner[:n_near]


@nb.njit(**_JIT)
def fold_rows(best, sim, owner):
    """``best[q, owner[j]] = max(best[q, owner[j]], sim[q, j])`` for every near row ``j``."""
    for j in range(owner.size):
        i = owner[j]
        for q in range(best.shape[0]):
            x = sim[q, j]
            cur = best[q, i]
            best[q, i] = x if x > cur else cur
    return best


def warm() -> None:
    """Compile (or load from numba's cache) every kernel with the argument types the first
    stage passes."""
    sim = np.zeros((1, 2), np.float32)
    ptr, cut = np.array([0, 1, 1], np.int64), np.array([0, 1], np.int64)
    walk_postings(sim, np.zeros(1, np.int64), cut, ptr, np.zeros(1, np.int32), np.ones(1, np.float32), 1)
    split_reached(np.zeros(1, np.float32), np.zeros(1, np.bool_))
    reach_scan(sim, np.ones(2, np.bool_), np.float32(0.4), 32)
    top_positions(np.zeros(2, np.float32), np.arange(2), 1)
    sim_t, best = vocab_major(sim)
    near_best, _, owner = far_rows(np.zeros(1, np.int64), np.array([0, 1], np.int64), np.zeros(1, np.int32), sim_t,
                                   best, np.float32(0.2))
    fold_rows(near_best, np.zeros((1, 1), np.float32), owner)
