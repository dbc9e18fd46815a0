"""Temporal expressions: find them, resolve them against a session date, rewrite them.

Candidate spans come from a regex prefilter (cheap, runs on every sentence); the parsing
itself is dateparser's, with ``RELATIVE_BASE`` = the session time and
``PREFER_DATES_FROM`` chosen from the tense around the span. Parses are cached per
(expression, anchor day, preference), so repeated phrases cost one dateparser call.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from enum import Enum
from functools import lru_cache

from dateparser.date import DateDataParser


class Granularity(str, Enum):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"
    YEAR = "year"


class Prefer(str, Enum):
    PAST = "past"
    FUTURE = "future"


@dataclass(frozen=True)
class DateMention:
    """A temporal expression in a text: ``text[start:end]`` resolved to ``resolved``."""
    start: int
    end: int
    text: str
    resolved: datetime
    granularity: Granularity
    relative: bool

    def to_json(self) -> dict[str, str]:
        return {"text": self.text, "date": self.resolved.date().isoformat(),
                "granularity": self.granularity.value, "relative": self.relative}


_MONTH = (r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
          r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)")
_WEEKDAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_NUM = (r"(?:\d{1,2}|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
        r"a\s+few|a\s+couple\s+of|a\s+couple|couple\s+of|few|several)")
_UNIT = r"(?:days?|weeks?|months?|years?)"
_YEAR = r"(?:19|20)\d\d"

_RELATIVE = [
    r"yesterday|today|tonight|tomorrow|the\s+day\s+before\s+yesterday|the\s+day\s+after\s+tomorrow",
    r"last\s+night|this\s+(?:morning|afternoon|evening)",
    rf"(?:last|next|this|past|coming)\s+(?:week(?:end)?|month|year|{_WEEKDAY})",
    rf"{_NUM}\s+{_UNIT}\s+ago",
    rf"in\s+{_NUM}\s+{_UNIT}",
    rf"(?:on\s+)?{_WEEKDAY}",
]
_ABSOLUTE = [
    rf"\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}(?:,?\s+{_YEAR})?",
    rf"{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+{_YEAR})?",
    rf"{_MONTH},?\s+{_YEAR}",
    rf"(?:in|since|during)\s+{_YEAR}",
]
_CANDIDATES = re.compile(
    r"\b(?:" + "|".join(f"(?P<r{i}>{p})" for i, p in enumerate(_RELATIVE)) + "|"
    + "|".join(f"(?P<a{i}>{p})" for i, p in enumerate(_ABSOLUTE)) + r")\b",
    re.IGNORECASE,
)
_PREFILTER = re.compile(
    rf"\b(?:ago|yesterday|today|tonight|tomorrow|last|next|this|past|coming|{_UNIT}|{_WEEKDAY}|{_MONTH}|{_YEAR})\b",
    re.IGNORECASE,
)
_FUTURE_CUES = re.compile(
    r"\b(?:will|won't|going\s+to|gonna|plan(?:ning|s)?\s+to|planning|hope\s+to|want\s+to|next|"
    r"tomorrow|coming|upcoming|soon|can't\s+wait|looking\s+forward|'ll)\b|'ll\b",
    re.IGNORECASE,
)
# Phrases dateparser does not read, mapped to ones it does (same meaning at day/week level).
_NORMALIZE = [
    (re.compile(r"\b(?:a\s+few|few|several)\b", re.I), "3"),
    (re.compile(r"\b(?:a\s+couple\s+of|a\s+couple|couple\s+of)\b", re.I), "2"),
    (re.compile(r"\blast\s+weekend\b", re.I), "last saturday"),
    (re.compile(r"\b(?:this|next|coming)\s+weekend\b", re.I), "saturday"),
    (re.compile(r"\bpast\s+", re.I), "last "),
    (re.compile(r"\bcoming\s+", re.I), "next "),
    (re.compile(r"^on\s+", re.I), ""),
    (re.compile(r"^(?:in|since|during)\s+(?=(?:19|20)\d\d$)", re.I), ""),
    (re.compile(r"\bthe\s+day\s+before\s+yesterday\b", re.I), "2 days ago"),
    (re.compile(r"\bthe\s+day\s+after\s+tomorrow\b", re.I), "in 2 days"),
]
# A bare weekday names a habit, not a day, when a quantifier comes before it ("every Sunday",
# "each Friday night", "every other Tuesday") or a plural part of the day after it ("on
# Saturday mornings", "Saturday nights are for games"): such a match is left as written.
_WEEKDAY_GROUP = f"r{len(_RELATIVE) - 1}"
_HABIT_BEFORE = re.compile(r"\b(?:every|each|other|most|usually|often|always|some)\s+(?:on\s+)?"
                           rf"(?:{_WEEKDAY}s?\s*(?:,|and|or|&)\s*)*$", re.I)  # "every Wednesday and Saturday"
_HABIT_AFTER = re.compile(r"^\s+(?:mornings|afternoons|evenings|nights)\b", re.I)
_PERIODS = {"day": Granularity.DAY, "week": Granularity.WEEK, "month": Granularity.MONTH,
            "year": Granularity.YEAR, "time": Granularity.DAY, "part_of_day": Granularity.DAY}
_CONTEXT_CHARS = 60


@lru_cache(maxsize=1024)
def _parser(prefer: Prefer, anchor_day: date) -> DateDataParser:
    base = datetime(anchor_day.year, anchor_day.month, anchor_day.day, 12, 0)
    return DateDataParser(languages=["en"], settings={
        "PREFER_DATES_FROM": prefer.value, "RETURN_TIME_AS_PERIOD": True, "RELATIVE_BASE": base})


def _normalize(expr: str) -> str:
    out = " ".join(expr.lower().split())
    for pattern, repl in _NORMALIZE:
        out = pattern.sub(repl, out)
    return out.strip()


# dateparser is not thread-safe (scrapinghub/dateparser#441, #813: its parsers keep per-call
# state, its locale loader is global), and a run in the driver builds tenants on several threads
_DATEPARSER = threading.Lock()


@lru_cache(maxsize=65536)
def _parse(expr: str, anchor_day: date, prefer: Prefer) -> tuple[date, Granularity] | None:
    with _DATEPARSER:
        data = _parser(prefer, anchor_day).get_date_data(expr)
    if data is None or data.date_obj is None:
        return None
    return data.date_obj.date(), _PERIODS.get(data.period or "day", Granularity.DAY)


def _prefer_for(text: str, start: int, end: int) -> Prefer:
    window = text[max(0, start - _CONTEXT_CHARS): end + _CONTEXT_CHARS]
    return Prefer.FUTURE if _FUTURE_CUES.search(window) else Prefer.PAST


def _is_habit(text: str, match: re.Match[str]) -> bool:
    """A bare weekday said of a habit ("every Sunday", "on Saturday mornings"), not of one day."""
    if not match.group(_WEEKDAY_GROUP):
        return False
    return bool(_HABIT_BEFORE.search(text[max(0, match.start() - 60):match.start()])
                or _HABIT_AFTER.match(text[match.end():match.end() + 16]))


def _is_relative(match: re.Match[str]) -> bool:
    return any(match.group(f"r{i}") for i in range(len(_RELATIVE)))


def _period_start(day: date, gran: Granularity) -> date:
    """Normalize a resolved date to the start of its period (Monday, 1st of month, 1 January)."""
    if gran is Granularity.WEEK:
        return day - timedelta(days=day.weekday())
    if gran is Granularity.MONTH:
        return day.replace(day=1)
    if gran is Granularity.YEAR:
        return day.replace(month=1, day=1)
    return day


def _as_datetime(day: date, anchor: datetime) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=anchor.tzinfo)


def resolve_dates(text: str, anchor: datetime) -> list[DateMention]:
    """Temporal expressions in ``text`` resolved against ``anchor`` (the session time)."""
    if not text or anchor is None or not _PREFILTER.search(text):
        return []
    out: list[DateMention] = []
    for m in _CANDIDATES.finditer(text):
        expr = m.group(0)
        if _is_habit(text, m):
            continue
        prefer = _prefer_for(text, m.start(), m.end())
        parsed = _parse(_normalize(expr), anchor.date(), prefer)
        if parsed is None:
            continue
        day, gran = parsed
        day = _period_start(day, gran)
        out.append(DateMention(m.start(), m.end(), expr, _as_datetime(day, anchor), gran, _is_relative(m)))
    return out


def format_mention(mention: DateMention) -> str:
    """Explicit phrase for a resolved mention: 'on 7 May 2023', 'in June 2023', 'in 2022'."""
    d = mention.resolved
    if mention.granularity is Granularity.DAY:
        return f"on {d.day} {d:%B} {d.year}"
    if mention.granularity is Granularity.WEEK:
        return f"in the week of {d.day} {d:%B} {d.year}"
    if mention.granularity is Granularity.MONTH:
        return f"in {d:%B} {d.year}"
    return f"in {d.year}"


def rewrite_relative(text: str, anchor: datetime, mentions: list[DateMention] | None = None) -> str:
    """``text`` with relative expressions replaced by explicit dates ("yesterday" -> "on 7 May 2023")."""
    if mentions is None:
        mentions = resolve_dates(text, anchor)
    pieces, pos = [], 0
    for m in mentions:
        if not m.relative:
            continue
        before = text[pos:m.start]
        phrase = format_mention(m)
        if not text[:m.start].strip() or text[:m.start].rstrip()[-1] in ".!?":
            phrase = phrase[0].upper() + phrase[1:]
        pieces.append(before)
        pieces.append(phrase)
        pos = m.end
    pieces.append(text[pos:])
    return "".join(pieces)
