"""A long turn scored by its best stretch of tokens, not by all of its tokens at once.

MaxSim over every token of a turn favours long turns: each query token takes its best match
among more candidates. With the windowed encoder (memlib/retrieve/token_windows.py) a long
assistant turn carries hundreds of tokens, and on longmemeval_s_dev24 such turns crowded the
evidence out of the top ranks (docs/evaluation.md). Here a turn's content tokens are cut, in
order, into chunks of ``size`` tokens; each chunk is scored like a turn, and the turn takes
the per-token best cosines of its best-scoring chunk. A turn of at most ``size`` tokens is one
chunk, scored exactly as before.
"""
from __future__ import annotations

import numpy as np


def segments(owner: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(owner turn of each chunk, first token row of each chunk) for tokens grouped by turn."""
    if owner.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    turn_start = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    lengths = np.diff(np.r_[turn_start, owner.size])
    rank = np.arange(owner.size) - np.repeat(turn_start, lengths)
    starts = np.flatnonzero(rank % max(int(size), 1) == 0)
    return owner[starts], starts


def best_of_chunks(sim: np.ndarray, owner: np.ndarray, size: int, weights: np.ndarray,
                   n_turns: int) -> np.ndarray:
    """(Q, n_turns): per turn, the per-query-token best cosines within its best chunk
    (``sim``: (Q, T) cosines of the query tokens with every token row)."""
    chunk_owner, starts = segments(owner, size)
    best = np.zeros((sim.shape[0], n_turns), dtype=np.float32)
    if starts.size == 0:
        return best
    chunk_best = np.maximum.reduceat(sim, starts, axis=1)             # (Q, chunks)
    score = weights.astype(np.float32) @ chunk_best
    order = np.lexsort((-score, chunk_owner))                        # per turn, best chunk first
    first = order[np.r_[True, chunk_owner[order][1:] != chunk_owner[order][:-1]]]
    best[:, chunk_owner[first]] = chunk_best[:, first]
    return best
