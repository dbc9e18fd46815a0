"""Question intent router (MAGMA): WHY / WHEN / ENTITY / OTHER from the question text,
and temporal expressions of a question resolved to a time window."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from enum import Enum

from memlib.text.dates import Granularity, resolve_dates


class Intent(str, Enum):
    WHY = "why"
    WHEN = "when"
    ENTITY = "entity"
    OTHER = "other"


_WHY = re.compile(r"\b(why|how come|what (?:caused|made|led)|reason|because|motivat\w*|inspired?)\b", re.I)
_WHEN = re.compile(r"\b(when|what (?:year|month|day|date|time)|how long|since when|before|after|"
                   r"first time|last time|recently|ago)\b", re.I)
_ENTITY = re.compile(r"^\s*(who|whom|whose|which|where|what (?:is|are|was|were) (?:the )?(?:name|names))\b"
                     r"|\b(name of|called|named)\b", re.I)


def route(question: str) -> Intent:
    """Rule-based intent: WHY beats WHEN beats ENTITY; anything else is OTHER."""
    if _WHY.search(question):
        return Intent.WHY
    if _WHEN.search(question):
        return Intent.WHEN
    if _ENTITY.search(question):
        return Intent.ENTITY
    return Intent.OTHER


_SPAN = {Granularity.DAY: timedelta(days=1), Granularity.WEEK: timedelta(days=7),
         Granularity.MONTH: timedelta(days=31), Granularity.YEAR: timedelta(days=366)}


_THIS_WEEKEND = re.compile(r"^this\s+weekend$", re.I)


def time_windows(question: str, anchor: datetime | None) -> list[tuple[datetime, datetime]]:
    """Time windows of the question's temporal expressions, resolved against ``anchor``
    (the question time, or the tenant's latest session time)."""
    anchor = anchor or datetime.now(timezone.utc)
    out = []
    for m in resolve_dates(question, anchor):
        start = m.resolved if m.resolved.tzinfo else m.resolved.replace(tzinfo=timezone.utc)
        span = _SPAN.get(m.granularity, timedelta(days=1))
        if _THIS_WEEKEND.match(m.text):
            # the weekend of the question's own week: memlib/text/dates.py reads "this weekend" as the
            # last Saturday unless a future cue is near ("my visit to the music store this weekend",
            # asked on a Tuesday, is not about the weekend before)
            day = anchor.date() + timedelta(days=5 - anchor.weekday())
            start, span = datetime(day.year, day.month, day.day, tzinfo=start.tzinfo), timedelta(days=2)
        out.append((start, start + span))
    return out


class TimeQuestion(str, Enum):
    """A question about the order of events or the time between them: its answer is computed from
    the events' own times (memlib/retrieve/event_time.py)."""
    ORDER = "order"
    DURATION = "duration"


_DURATION = re.compile(r"\bhow long\b|\bhow much time\b|\bhow many (?:minutes|hours|days|weeks|months|years)\b"
                       r"|\b(?:passed|elapsed|gap)\b[^?]*\bbetween\b", re.I)
_ORDER = re.compile(r"\b(?:before or after|after or before|in (?:what|which) order)\b"
                    r"|\b(?:first|earlier|sooner|later)\b[^?]*\bor\b"      # "which did I do first, X or Y?"
                    r"|\bor\b[^?]*\b(?:first|earlier|sooner|later)\b"      # "X or Y, which came first?"
                    r"|^\s*(?:did|was|were|had|have|has|do|does)\b[^?]*\b(?:before|after)\b", re.I)


def time_question(question: str) -> TimeQuestion | None:
    """DURATION ("how long", "how many days/weeks/months/years", "passed between X and Y"), else ORDER
    ("before or after", "which ... first/earlier, X or Y", "did X happen before Y"), else None. A
    "first" or "after" that only names an event ("When did John have his first call-out?", "What did
    Melanie realize after the race?") is neither."""
    if _DURATION.search(question):
        return TimeQuestion.DURATION
    if _ORDER.search(question):
        return TimeQuestion.ORDER
    return None


_BETWEEN = re.compile(r"\bbetween\s+(.+?)\s+and\s+([^?]+)", re.I)
_CHOICE = re.compile(r"[,:]\s*([^,:?]+?)\s+or\s+([^?]+)", re.I)
_EITHER = re.compile(r"^(.+?)\s+(?:before or after|after or before)\s+([^?]+)", re.I)
_CUT = re.compile(r"\s+(?:before|after|when|since|until|while)\s+|\s+(?:did|do|does|was|were|had|have|has)\s+"
                  r"(?:i|we|he|she|they)\s+", re.I)
_STEM = frozenset("how long many much time which what who when did do does was were had have has i you we he she "
                  "they it the a an in total first earlier later sooner or and between before after ago passed elapsed "
                  "minutes hours days weeks months years event one thing".split())


def event_mentions(question: str) -> list[str]:
    """The events an order or duration question names, in question order: the two sides of "between
    X and Y", of ", X or Y", of "X before or after Y", else the question's clauses cut at
    before/after/when/since/until/while and at "did I" (not at "did you": "how long did you say I
    should leave it on?" asks what the assistant said, not about two events; nor at commas): "How
    many days before the meeting did I attend the workshop?" names "the meeting", "attend the
    workshop"; a clause of question words only
    ("How many days") names none. Fewer than two: the question names one event or its events could
    not be told apart."""
    q = question.strip()
    for pattern in (_BETWEEN, _CHOICE, _EITHER):
        m = pattern.search(q)
        if m:
            parts = [m.group(1), m.group(2)]
            break
    else:
        parts = _CUT.split(q)
    out = []
    for part in parts:
        part = part.strip(" ?.!'\"")
        words = [w for w in re.findall(r"[^\W_]+", part.lower())]
        if any(w not in _STEM for w in words):
            out.append(part)
    return out
