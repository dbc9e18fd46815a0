"""Vectorized per-turn signals shared by the strategies: standardization, session priors,
adjacent-turn context, and turn votes from other node kinds through provenance."""
from __future__ import annotations

import re

import numpy as np

from memlib.lazy import cached_property


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
        self.speaker = np.asarray([_first_name(index.turns[t].speaker) for t in self.ids], dtype=object)

    def subset(self, positions: np.ndarray) -> "TurnFrame":
        """The frame of the turns at ``positions`` (ascending) only; a turn's neighbours are its
        session neighbours when they are in the subset too."""
        sub = object.__new__(TurnFrame)
        sub.ids = [self.ids[i] for i in positions.tolist()]
        sub.pos = {t: i for i, t in enumerate(sub.ids)}
        _, sub.session = np.unique(self.session[positions], return_inverse=True) if positions.size else (
            None, np.zeros(0, np.int64))
        sub.n_sessions = int(sub.session.max()) + 1 if sub.session.size else 0
        sub.times, sub.assistant = self.times[positions], self.assistant[positions]
        sub.speaker = self.speaker[positions]
        inverse = np.full(self.session.size + 1, -1, dtype=np.int64)     # last slot: "no neighbour"
        inverse[positions] = np.arange(positions.size)
        sub.neighbours = tuple(inverse[n[positions]] for n in self.neighbours)
        return sub

    @cached_property
    def neighbours(self) -> tuple[np.ndarray, np.ndarray]:
        """(previous, next) turn of each turn in its session, as positions (-1: none). A session's
        turns keep their order in the frame, but a tenant of several conversations interleaves
        their sessions there (``session_index`` counts within a conversation), so the neighbour
        in the frame can belong to another session."""
        n = self.session.size
        order = np.lexsort((np.arange(n), self.session))
        same = self.session[order][1:] == self.session[order][:-1]
        prev, nxt = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        prev[order[1:][same]] = order[:-1][same]
        nxt[order[:-1][same]] = order[1:][same]
        return prev, nxt

    @cached_property
    def by_session(self) -> tuple[np.ndarray, np.ndarray]:
        """(start of each session's entries, the positions of its turns ascending), sessions by code."""
        counts = np.bincount(self.session, minlength=self.n_sessions)
        ptr = np.zeros(self.n_sessions + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        return ptr, np.argsort(self.session, kind="stable").astype(np.int64)

    def session_turns(self, positions: np.ndarray) -> np.ndarray:
        """The positions (ascending) of every turn of the sessions the turns at ``positions`` belong to."""
        ptr, order = self.by_session
        codes = np.unique(self.session[positions])
        starts, counts = ptr[codes], ptr[codes + 1] - ptr[codes]
        slots = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        return np.sort(order[slots])

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
        prev, nxt = self.neighbours
        return np.maximum(np.where(prev >= 0, scores[prev], floor), np.where(nxt >= 0, scores[nxt], floor))

    @cached_property
    def sessions_of_speaker(self) -> dict[str, np.ndarray]:
        """Per speaker name (first word, lower case): the session codes it speaks in."""
        if self.speaker.size == 0:
            return {}
        out: dict[str, list[int]] = {}
        for name, sess in sorted(set(zip(self.speaker.tolist(), self.session.tolist()))):
            if name:
                out.setdefault(name, []).append(int(sess))
        return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}

    def named_participants(self, query: str) -> np.ndarray:
        """Per turn: whether a speaker of its session is named in ``query`` (a query word equal to
        the first word of a speaker's name, case-insensitive). All false when the query names
        nobody who speaks in the tenant."""
        words = set(_WORD.findall(query.lower()))
        hits = [self.sessions_of_speaker[w] for w in words if w in self.sessions_of_speaker]
        if not hits:
            return np.zeros(self.session.size, dtype=bool)
        named = np.zeros(self.n_sessions, dtype=bool)
        named[np.concatenate(hits)] = True
        return named[self.session]

    def named_speakers(self, query: str) -> np.ndarray:
        """Per turn: whether its own speaker is named in ``query`` (a query word equal to the first
        word of the speaker's name, case-insensitive). All false when the query names nobody who
        speaks in the tenant (docs/decisions/0037-named-speaker-turns.md)."""
        names, codes = self.speaker_codes
        words = set(_WORD.findall(query.lower()))
        hit = np.asarray([bool(n) and n in words for n in names.tolist()], dtype=bool)
        return hit[codes] if hit.any() else np.zeros(codes.size, dtype=bool)

    @cached_property
    def speaker_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """(the distinct speaker names, each turn's index into them)."""
        if self.speaker.size == 0:
            return np.zeros(0, dtype=object), np.zeros(0, dtype=np.int64)
        names, codes = np.unique(self.speaker.astype(str), return_inverse=True)
        return names.astype(object), codes.astype(np.int64)

    @cached_property
    def by_role(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions of turns that are not an assistant's, positions of assistant turns)."""
        return np.flatnonzero(~self.assistant), np.flatnonzero(self.assistant)

    def votes(self, index, node_scores: dict[str, float]) -> np.ndarray:
        """Per turn: the max score of any node citing it through provenance."""
        out = np.zeros(len(self.ids))
        for nid, s in node_scores.items():
            pos = [self.pos[t] for t in index.turns_of(nid) if t in self.pos]
            if pos:
                out[pos] = np.maximum(out[pos], s)
        return out


_WORD = re.compile(r"[^\W\d_]+")


def _first_name(speaker) -> str:
    """The first word of a speaker's name, lower case ("" for none)."""
    words = _WORD.findall((speaker or "").lower())
    return words[0] if words else ""


def _epoch(t) -> float:
    return t.timestamp() if t is not None else np.nan


def turn_frame(index) -> TurnFrame:
    """The :class:`TurnFrame` of ``index`` (built once per tenant view)."""
    return index.memo("turn_frame", lambda: TurnFrame(index))
