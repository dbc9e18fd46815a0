"""Vectorized per-turn signals shared by the strategies: standardization, session priors,
adjacent-turn context, and turn votes from other node kinds through provenance."""
from __future__ import annotations

from functools import cached_property

import numpy as np


def zscore(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    sd = float(x.std())
    return (x - x.mean()) / sd if sd > 1e-12 else np.zeros_like(x)


def minmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    lo, hi = float(x.min()), float(x.max())
    return (x - lo) / (hi - lo) if hi - lo > 1e-12 else np.zeros_like(x)


class TurnFrame:
    """A tenant's turns in conversation order with session codes (built once per index)."""

    def __init__(self, index):
        self.ids: list[str] = list(index.turn_order)
        self.pos: dict[str, int] = {t: i for i, t in enumerate(self.ids)}
        sess = np.asarray([index.turns[t].session_id for t in self.ids], dtype=object)
        _, self.session = np.unique(sess, return_inverse=True) if sess.size else (None, np.zeros(0, np.int64))
        self.n_sessions = int(self.session.max()) + 1 if self.session.size else 0
        self.times = np.asarray([_epoch(index.turns[t].time) for t in self.ids], dtype=np.float64)
        self.assistant = np.asarray([index.turns[t].role == "assistant" for t in self.ids], dtype=bool)

    @cached_property
    def same_prev(self) -> np.ndarray:
        return np.r_[False, self.session[1:] == self.session[:-1]]

    def session_prior(self, scores: np.ndarray, top: int) -> np.ndarray:
        """Per turn: mean of the ``top`` best scores in its session."""
        if scores.size == 0:
            return scores
        order = np.lexsort((-scores, self.session))
        sess = self.session[order]
        starts = np.flatnonzero(np.r_[True, sess[1:] != sess[:-1]])
        rank = np.arange(sess.size) - np.repeat(starts, np.diff(np.r_[starts, sess.size]))
        keep = rank < top
        total = np.bincount(sess[keep], weights=scores[order][keep], minlength=self.n_sessions)
        count = np.bincount(sess[keep], minlength=self.n_sessions)
        return (total / np.maximum(count, 1))[self.session]

    def session_leaders(self, scores: np.ndarray) -> np.ndarray:
        """Per turn: whether it is the best-scored turn of its session (ties: the earlier one)."""
        lead = np.zeros(scores.size, dtype=bool)
        if scores.size == 0:
            return lead
        order = np.lexsort((np.arange(scores.size), -scores, self.session))
        sess = self.session[order]
        lead[order[np.r_[True, sess[1:] != sess[:-1]]]] = True
        return lead

    def adjacent(self, scores: np.ndarray) -> np.ndarray:
        """Per turn: the best score of its previous/next turn in the same session."""
        if scores.size == 0:
            return scores
        floor = float(scores.min())
        prev = np.where(self.same_prev, np.r_[floor, scores[:-1]], floor)
        nxt = np.where(np.r_[self.same_prev[1:], False], np.r_[scores[1:], floor], floor)
        return np.maximum(prev, nxt)

    def votes(self, index, node_scores: dict[str, float]) -> np.ndarray:
        """Per turn: the max score of any node citing it through provenance."""
        out = np.zeros(len(self.ids))
        for nid, s in node_scores.items():
            pos = [self.pos[t] for t in index.turns_of(nid) if t in self.pos]
            if pos:
                out[pos] = np.maximum(out[pos], s)
        return out


def _epoch(t) -> float:
    return t.timestamp() if t is not None else np.nan


def turn_frame(index) -> TurnFrame:
    """The :class:`TurnFrame` of ``index`` (built once per tenant view)."""
    return index.memo("turn_frame", lambda: TurnFrame(index))
