"""Fact-augmented keys for ``auto``: turns also found through the nodes extracted from them.

LongMemEval's paper indexes a turn under extra keys (facts extracted from it); here the store
already holds such nodes (facts, events, ...) with vectors and ``provenance`` to their turns.
A turn's key score is the best cosine between the query vector (the store's query embedder)
and any node of the chosen kinds that cites it; turns no such node cites get the lowest score.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def _pairs(index, frame, kinds: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(node row, turn position) for every provenance link of the nodes of ``kinds`` (cached on the index)."""
    cache = index.__dict__.setdefault("_memlib_key_pairs", {})
    if kinds not in cache:
        rows, turns = [], []
        for r in index.rows_of_kind(kinds):
            for t in index.provenance[r]:
                pos = frame.pos.get(t)
                if pos is not None:
                    rows.append(r)
                    turns.append(pos)
        cache[kinds] = (np.asarray(rows, dtype=np.int64), np.asarray(turns, dtype=np.int64))
    return cache[kinds]


def key_scores(index, frame, query: str, kinds: Sequence[str]) -> np.ndarray:
    """Per turn (conversation order): max cosine of the query with the nodes of ``kinds`` citing it."""
    rows, turns = _pairs(index, frame, tuple(sorted(kinds)))
    out = np.full(len(frame.ids), np.nan)
    if rows.size == 0:
        return np.zeros(len(frame.ids))
    q = index.embed_query(query)
    sims = index.embeddings[rows] @ q
    np.fmax.at(out, turns, sims.astype(np.float64))
    floor = float(np.nanmin(out))
    return np.where(np.isnan(out), floor, out)
