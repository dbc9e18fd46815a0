"""Event times in ``auto``: the times the build resolved for its events and facts from the turns' own
words ("last Wednesday I went hiking", said on 2023-05-10: 2023-05-03), read where the question's time
windows are matched, where an order or duration question's events are looked for, and in what a
returned turn carries (docs/decisions/0042-event-times.md).

* **Windows**: a scored turn is in a window of the question when its session time is, or the time of
  an event or fact citing it (:func:`event_window`).
* **Each event its own evidence**: an order or duration question ("which did I do first, X or Y?",
  "how many days passed between X and Y?") names its events (memlib/retrieve/intent.py
  ``event_mentions``); each mention's vector votes, as the question's does, through the best fact or
  event citing a turn (:func:`mention_masks` finds its tokens in the question's).
* **Dates shown**: a returned turn cited by an event carries that event's resolved date
  (``event_time``, epoch seconds of the date's UTC midnight, and ``event_span_days``: 1 for a day, 7 a
  week, 31 a month, 366 a year), printed by the contexts next to its session date
  (:func:`event_dates`, :func:`format_event`).

The times come from the tenant's node view (its ``time`` column, at the memory view's rows); a store
whose memories have no times reads session times only, and says so once per tenant view.
"""
from __future__ import annotations

import json
import logging
import weakref
from datetime import datetime, timezone
from typing import Any

import numpy as np

log = logging.getLogger("memlib.serve")
DAY_S = 86400.0
SPAN_DAYS = {"day": 1.0, "week": 7.0, "month": 31.0, "year": 366.0}
# per memory frame (memoized on its tenant view, so it lives as long as the view): its memories' times,
# which of them are dated events, and the spans looked up so far; made once, not on every question
_FRAME_TIMES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def frame_times(index, mem) -> tuple[np.ndarray, np.ndarray, dict[int, float]]:
    """(per memory of ``mem``: its time as epoch seconds (NaN: none); whether it is a dated event;
    the spans in days found so far, by memory position), made once per memory frame."""
    got = _FRAME_TIMES.get(mem)
    if got is None:
        times = index.time_epochs[mem.rows] if mem.rows.size else np.zeros(0)
        dated = (mem.kind == "event") & np.isfinite(times) if times.size else np.zeros(0, dtype=bool)
        got = _FRAME_TIMES[mem] = (times, np.asarray(dated, dtype=bool), {})
    return got


def memory_times(index, mem) -> np.ndarray | None:
    """Per memory of ``mem`` (a :class:`~memlib.retrieve.memory.MemoryFrame`): its time as epoch
    seconds (NaN: none). None when no memory has a time (a store built before the build dated them):
    logged once per tenant view, and the windows read session times only."""
    times = frame_times(index, mem)[0]
    if mem.rows.size and not np.isfinite(times).any():
        def note() -> bool:
            log.info("tenant %s: its events and facts carry no times (a store built before them); the "
                     "question's time windows read session times only", index.tenant)
            return True
        index.memo(("event_time_missing",), note)
        return None
    return times


def event_window(index, mem, windows: list[tuple[float, float]], positions: np.ndarray | None) -> np.ndarray | None:
    """Per turn at ``positions`` of the frame (None: every turn): whether an event or fact citing it
    is dated inside one of ``windows`` (epoch seconds, [start, end)). None without memory times."""
    times = memory_times(index, mem)
    if times is None or not windows:
        return None
    hit = np.zeros(times.size, dtype=bool)
    for a, b in windows:
        hit |= (times >= a) & (times < b)
    return mem.any_citing(hit, positions)


def mention_masks(encoder, query: str, q_ids: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """(mention, its tokens among the question's ``q_ids``) of each event an order or duration question
    names, when it names two or more (none otherwise). A mention's tokens are its content tokens
    found as a run of the question's, after the previous mention's (an empty mask: not found)."""
    from memlib.retrieve.intent import event_mentions, time_question  # dateparser: imported when asked

    mentions = event_mentions(query) if time_question(query) is not None else []
    if len(mentions) < 2:
        return []
    out, start = [], 0
    for text, ids in zip(mentions, encoder.content_ids(mentions)):
        mask = np.zeros(q_ids.size, dtype=bool)
        n = int(ids.size)
        for at in range(start, q_ids.size - n + 1) if n else ():
            if np.array_equal(q_ids[at:at + n], ids):
                mask[at:at + n] = True
                start = at + n
                break
        out.append((text, mask))
    return out


def span_days(attributes: str | None) -> float:
    """The span of an event's date as the build picked it (memlib/extract/events.py
    ``pick_event_time``: its first day, week or month mention, else its first mention), in days."""
    try:
        found = json.loads(attributes).get("dates_mentioned") if attributes else None
    except (ValueError, AttributeError):
        found = None
    found = [m for m in found or [] if isinstance(m, dict)]
    dated = [m for m in found if m.get("granularity") in ("day", "week", "month")]
    pick = (dated or found or [{}])[0]
    return SPAN_DAYS.get(pick.get("granularity"), 1.0)


def event_dates(index, mem, positions: np.ndarray, qvec: np.ndarray | None) -> dict[int, tuple[float, float]]:
    """Per turn position of ``positions`` (of the whole frame) cited by a dated event: (the event's
    resolved date as epoch seconds of its UTC midnight, its span in days), of the citing event nearest
    the question (``qvec``; None: the first). The build stores a date as midnight in its session's
    zone: the nearest UTC midnight is that date for any zone within 12 hours of UTC."""
    times = memory_times(index, mem)
    if times is None or not positions.size:
        return {}
    _, dated, spans = frame_times(index, mem)
    out = {}
    for p in positions.tolist():
        cands = mem.cite_row[mem.cite_ptr[p]:mem.cite_ptr[p + 1]]
        cands = cands[dated[cands]]
        if not cands.size:
            continue
        best = int(cands[0])
        if qvec is not None and mem.vectors.size and cands.size > 1:
            best = int(cands[int(np.argmax(mem.vectors[cands] @ qvec))])
        day = float(np.floor((times[best] + DAY_S / 2) / DAY_S) * DAY_S)
        if best not in spans:
            spans[best] = span_days(index.attribute(int(mem.rows[best])))
        out[p] = (day, spans[best])
    return out


def format_event(signals: dict[str, Any], session_time: datetime | None) -> str:
    """"event 2023-05-03" (a week: "event week of 2023-05-01", a month "event 2023-05", a year "event
    2023") for a turn whose ``signals`` carry an ``event_time`` on another day than ``session_time``;
    "" otherwise."""
    when = signals.get("event_time")
    if when is None or not np.isfinite(when):
        return ""
    day = datetime.fromtimestamp(float(when), tz=timezone.utc).date()
    if session_time is not None and session_time.date() == day:
        return ""
    span = float(signals.get("event_span_days", 1.0))
    text = {7.0: f"week of {day:%Y-%m-%d}", 31.0: f"{day:%Y-%m}", 366.0: f"{day:%Y}"}.get(span, f"{day:%Y-%m-%d}")
    return f"event {text}"



def mention_votes(mem, scored: tuple[np.ndarray | None, np.ndarray], mvecs: np.ndarray,
                  vectors: list[np.ndarray | None]) -> list[tuple[str, np.ndarray]]:
    """(``mention_vote_<i>``, per scored turn: the best cosine of a fact or event citing it with the
    i-th mention's vector) for each mention with a vector (None: its tokens were not found among the
    question's, :func:`mention_masks`); ``scored``: (the scored positions, None: all; the memories
    ``rows`` of ``mem`` citing their sessions); ``mvecs``: the vectors of those memories. A mention's
    vector is pooled from its tokens' vectors as the question's is (memlib/retrieve/memory.py
    ``query_vector``)."""
    pool, rows = scored
    out = []
    for i, vec in enumerate(vectors, start=1):
        if vec is None or not mvecs.size:
            continue
        sims = mvecs @ vec
        votes = np.maximum(mem.votes_at(pool, rows, sims, "fact"), mem.votes_at(pool, rows, sims, "event"))
        out.append((f"mention_vote_{i}", votes))
    return out
