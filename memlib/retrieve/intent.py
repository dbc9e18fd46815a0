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


def time_windows(question: str, anchor: datetime | None) -> list[tuple[datetime, datetime]]:
    """Time windows of the question's temporal expressions, resolved against ``anchor``
    (the question time, or the tenant's latest session time)."""
    anchor = anchor or datetime.now(timezone.utc)
    out = []
    for m in resolve_dates(question, anchor):
        start = m.resolved if m.resolved.tzinfo else m.resolved.replace(tzinfo=timezone.utc)
        out.append((start, start + _SPAN.get(m.granularity, timedelta(days=1))))
    return out
