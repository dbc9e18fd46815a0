"""Record validation: tenant ids, reason codes, date parsing and the quarantine collector."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from enum import Enum
from typing import Any

import pyarrow as pa

from memlib import schema

TENANT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
RAW_LIMIT = 2048


class ReasonCode(str, Enum):
    BAD_JSON = "bad_json"                  # a JSONL line that is not JSON
    BAD_UTF8 = "bad_utf8"                  # a line that is not valid UTF-8
    NOT_OBJECT = "not_object"              # JSON that is not an object where a record is expected
    MISSING_FIELD = "missing_field"        # a required id / field is absent or not a non-empty string
    BAD_TENANT_ID = "bad_tenant_id"        # tenant id fails TENANT_ID_RE
    EMPTY_TEXT = "empty_text"              # text is blank
    NON_STRING_TEXT = "non_string_text"    # text is a number, list, null ...
    OVERSIZE_TURN = "oversize_turn"        # text longer than io.max_turn_chars
    UNKNOWN_ROLE = "unknown_role"          # role not in user | assistant | other
    BAD_DATE = "bad_date"                  # session_time (or question time) unparseable
    DUPLICATE_TURN_ID = "duplicate_turn_id"  # turn id seen before in the same conversation
    BAD_EXTRAS = "bad_extras"              # extras present but not an object
    BAD_SESSION = "bad_session"            # a session that is not a list of turns
    BAD_QUESTION = "bad_question"          # a question record without id or question text
    UNKNOWN_KIND = "unknown_kind"          # a JSONL line whose "kind" is not turn | question
    TOO_DEEP = "too_deep"                  # a record nested deeper than JSON decoding allows
    BAD_UNICODE = "bad_unicode"            # a string with a lone surrogate (cannot be stored as UTF-8)
    OVERSIZE_RECORD = "oversize_record"    # a JSONL line longer than 16 MiB (never read whole)


# a record's rejection: its reason code and the reason, in one line
Issue = tuple[ReasonCode, str]


def validate_tenant_id(value: Any) -> str | None:
    """Reason why ``value`` is not a valid tenant id, or ``None`` when it is valid."""
    if not isinstance(value, str):
        return f"tenant id must be a string, got {type(value).__name__}"
    if not TENANT_ID_RE.fullmatch(value):
        return (f"tenant id {value[:80]!r} must match {TENANT_ID_RE.pattern} "
                "(letters, digits, '.', '_', '-'; no path separators; at most 128 chars)")
    return None


def is_id(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def storable(text: str) -> str:
    """``text`` with each lone surrogate written as its backslash escape (``\\ud800`` for U+D800;
    UTF-8 cannot store them)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def raw_text(record: Any) -> str:
    """The offending record as text, truncated to 2 KB."""
    if isinstance(record, bytes):
        text = record[:RAW_LIMIT * 4].decode("utf-8", errors="replace")
    elif isinstance(record, str):
        text = record[:RAW_LIMIT]
    else:
        try:
            text = json.dumps(record, ensure_ascii=False, default=str)
        except (RecursionError, ValueError):
            text = f"<{type(record).__name__} nested too deep to print>"
    return storable(text[:RAW_LIMIT])


_PLAIN = (int, float, bool)


def unstorable_field(record: dict[str, Any]) -> str | None:
    """The first field of ``record`` holding a string UTF-8 cannot encode (a lone surrogate)."""
    for key, value in record.items():
        if value is None or type(value) in _PLAIN or (type(value) is str and value.isascii()):
            continue  # nothing UTF-8 cannot encode (a json.dumps of every null was 0.1 s of a 27k-turn read)
        try:
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
            text.encode("utf-8")
        except UnicodeEncodeError:
            return storable(str(key))
        except (RecursionError, ValueError, TypeError):
            continue
    return None


# -- dates ------------------------------------------------------------------------------

_LOCOMO_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M%p on %d %B, %Y")
_WEEKDAY_RE = re.compile(r"\s*\([A-Za-z]{2,9}\)\s*")


YEARS = (1000, 9000)  # dates outside are refused: relative dates around them would overflow datetime


def _utc(dt: datetime) -> datetime | None:
    try:
        out = dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00
        return None
    return out if YEARS[0] <= out.year <= YEARS[1] else None


def parse_locomo_time(value: Any) -> datetime | None:
    """``"1:56 pm on 8 May, 2023"`` -> aware UTC datetime, ``None`` when unparseable."""
    if not isinstance(value, str):
        return None
    text = " ".join(value.split())
    for fmt in _LOCOMO_FORMATS:
        try:
            return _utc(datetime.strptime(text, fmt))
        except ValueError:
            continue
    return None


def parse_longmemeval_time(value: Any) -> datetime | None:
    """``"2023/05/25 (Thu) 20:21"`` -> aware UTC datetime, ``None`` when unparseable."""
    if not isinstance(value, str):
        return None
    try:
        return _utc(datetime.strptime(_WEEKDAY_RE.sub(" ", value).strip(), "%Y/%m/%d %H:%M"))
    except ValueError:
        return None


def parse_iso_time(value: Any) -> datetime | None:
    """ISO 8601 (date or date-time, optional offset/``Z``) -> aware UTC datetime."""
    if isinstance(value, datetime):
        return _utc(value)
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return _utc(datetime.fromisoformat(value.strip()))
    except ValueError:
        return None


# -- quarantine -------------------------------------------------------------------------

class Quarantine:
    """Collects rejected records as rows of :data:`memlib.schema.QUARANTINE`."""

    def __init__(self, source: str):
        self.source = source
        self.rows: list[dict[str, Any]] = []

    def add(self, issue: Issue, location: str, raw: Any, *,
            tenant_id: Any = None, conversation_id: Any = None, record_id: Any = None) -> None:
        """One rejected record: ``issue`` is (reason code, reason), ``location`` where it stands."""
        code, reason = issue
        text = lambda v: storable(v) if isinstance(v, str) else None  # noqa: E731
        self.rows.append({
            "tenant_id": text(tenant_id) if validate_tenant_id(tenant_id) is None else None,
            "conversation_id": text(conversation_id),
            "record_id": text(record_id),
            "source": storable(self.source),
            "location": location,
            "reason_code": code.value,
            "reason": storable(reason),
            "raw": raw_text(raw),
        })

    def table(self) -> pa.Table:
        return pa.Table.from_pylist(self.rows, schema=schema.QUARANTINE)
