"""``TenantBuilder``: validates turn and question records of one tenant and builds the
``turns`` / ``questions`` / ``quarantine`` tables. Every format reader maps its records to
plain dicts and hands them here, so the validation rules exist once."""
from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa

from memlib import ids, schema
from memlib.config import IOConfig
from memlib.io.result import ReadResult
from memlib.io.scan import MAX_DEPTH, too_deep
from memlib.io.validate import (
    YEARS,
    Issue,
    Quarantine,
    ReasonCode,
    is_id,
    unstorable_field,
    validate_tenant_id,
)

TimeParser = Callable[[Any], "datetime | None"]
ID_FIELDS = ("tenant_id", "conversation_id", "session_id", "turn_id")
ROLES = {r.value for r in schema.Role}


def _extras(value: Any) -> tuple[str | None, Issue | None]:
    """Extras as a JSON object string, or the reason it is not an object."""
    if value is None:
        return None, None
    if isinstance(value, str):
        try:
            if too_deep(value):
                raise RecursionError
            value = json.loads(value)
        except ValueError:  # JSONDecodeError, or a number too long to convert
            return None, (ReasonCode.BAD_EXTRAS, "extras is a string that is not a JSON object")
        except RecursionError:
            return None, (ReasonCode.TOO_DEEP, f"extras nested deeper than {MAX_DEPTH} levels")
    if not isinstance(value, dict):
        return None, (ReasonCode.BAD_EXTRAS, f"extras must be an object, got {type(value).__name__}")
    try:
        return (json.dumps(value, ensure_ascii=False, sort_keys=True, default=str) if value else None), None
    except RecursionError:
        return None, (ReasonCode.TOO_DEEP, "extras nested too deep to encode")


def _ids_given(rec: dict[str, Any]) -> bool:
    """The conversation, session and turn ids are non-blank strings (what ``is_id`` asks of each)."""
    return is_id(rec.get("conversation_id")) and is_id(rec.get("session_id")) and is_id(rec.get("turn_id"))


_UNSEEN = object()
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICRO = timedelta(microseconds=1)


def micros(when: datetime | None) -> int | None:
    """``when`` as a TURNS session_time value, computed as Arrow converts a datetime to timestamp("us")
    (its UTC instant; a naive one read as UTC), without Arrow's conversion (which imports pandas)."""
    if when is None:
        return None
    return (when - (_EPOCH if when.tzinfo is not None else _EPOCH.replace(tzinfo=None))) // _MICRO


class _TurnColumns:
    """The kept turns of a builder, a list per column in record order (a dict per turn was 27k dicts
    of a 27k-turn tenant, each filled and read back field by field)."""

    def __init__(self) -> None:
        self.tenant: list[str] = []
        self.conv: list[str] = []
        self.session: list[str] = []
        self.time: list[int | None] = []  # microseconds since the epoch
        self.turn: list[str] = []
        self.speaker: list[str | None] = []
        self.role: list[str] = []
        self.text: list[str] = []
        self.extras: list[str | None] = []

    def add(self, rec: dict[str, Any], time: int | None, role: str, extras: str | None) -> None:
        """A turn record that passed every check, with its parsed time, role and extras."""
        speaker = rec.get("speaker")
        self.tenant.append(rec["tenant_id"])
        self.conv.append(rec["conversation_id"])
        self.session.append(rec["session_id"])
        self.time.append(time)
        self.turn.append(rec["turn_id"])
        self.speaker.append(speaker if isinstance(speaker, str) else None)
        self.role.append(role)
        self.text.append(rec["text"])
        self.extras.append(extras)


class TenantBuilder:
    """Collects one tenant's records; ``result()`` returns the validated tables."""

    def __init__(self, source: str, cfg: IOConfig, parse_time: TimeParser, *, require_time: bool):
        self.cfg = cfg
        self.parse_time = parse_time
        self.require_time = require_time
        self.quarantine = Quarantine(source)
        self._turns = _TurnColumns()
        self._questions: list[dict[str, Any]] = []
        self._seen: set[tuple[str, str, str]] = set()
        self._valid_tenants: set[str] = set()  # tenant ids validated once (a tenant's every turn names it)
        self._times: dict[str, int | None] = {}  # session_time text -> its microseconds, None if unparseable

    # -- turns ---------------------------------------------------------------------------

    def reject(self, issue: Issue, location: str, raw: Any, rec: dict[str, Any] | None = None,
               record_id: Any = None) -> None:
        rec = rec or {}
        tenant = rec.get("tenant_id") if issue[0] is not ReasonCode.BAD_TENANT_ID else None
        self.quarantine.add(issue, location, raw, tenant_id=tenant,
                            conversation_id=rec.get("conversation_id"),
                            record_id=record_id if record_id is not None else rec.get("turn_id"))

    def _check_turn(self, rec: dict[str, Any], surrogates: bool) -> Issue | None:
        bad_field = unstorable_field(rec) if surrogates else None
        if bad_field is not None:
            return ReasonCode.BAD_UNICODE, f"field {bad_field!r} holds a lone surrogate (not storable as UTF-8)"
        tenant = rec.get("tenant_id")
        if not (type(tenant) is str and tenant in self._valid_tenants and _ids_given(rec)):
            missing = [k for k in ID_FIELDS if not is_id(rec.get(k))]
            if missing:
                return ReasonCode.MISSING_FIELD, f"missing or empty id field(s): {', '.join(missing)}"
            bad_tenant = validate_tenant_id(tenant)
            if bad_tenant:
                return ReasonCode.BAD_TENANT_ID, bad_tenant
            if type(tenant) is str:
                self._valid_tenants.add(tenant)
        if "text" not in rec:
            return ReasonCode.MISSING_FIELD, "missing field: text"
        text = rec["text"]
        if not isinstance(text, str):
            return ReasonCode.NON_STRING_TEXT, f"text must be a string, got {type(text).__name__}"
        if not text.strip():
            return ReasonCode.EMPTY_TEXT, "text is empty or whitespace"
        if len(text) > self.cfg.max_turn_chars:
            return (ReasonCode.OVERSIZE_TURN,
                    f"text has {len(text)} chars, more than io.max_turn_chars={self.cfg.max_turn_chars}")
        role = rec.get("role")
        if type(role) is str and role in ROLES:  # the common case: a role as memlib spells it
            return None
        if role is None or (isinstance(role, str) and not role.strip()):
            return ReasonCode.MISSING_FIELD, f"missing field: role (one of {sorted(ROLES)})"
        if not isinstance(role, str) or role.strip().lower() not in ROLES:
            return ReasonCode.UNKNOWN_ROLE, f"role {role!r} is not one of {sorted(ROLES)}"
        return None

    def _session_time(self, rec: dict[str, Any]) -> tuple[int | None, Issue | None]:
        """The session time as microseconds since the epoch (what the TURNS column stores), or why
        it is refused. A text seen before is not parsed again (a session's turns all repeat it)."""
        value = rec.get("session_time")
        if value is None or value == "":
            if self.require_time:
                return None, (ReasonCode.BAD_DATE, "session has no date")
            return None, None
        if type(value) is str:
            when = self._times.get(value, _UNSEEN)
            if when is _UNSEEN:
                when = self._times[value] = micros(self.parse_time(value))
        else:
            when = micros(self.parse_time(value))
        if when is None:
            return None, (ReasonCode.BAD_DATE, f"unparseable session_time {str(value)[:80]!r} (ISO 8601, years "
                                               f"{YEARS[0]}-{YEARS[1]})")
        return when, None

    def add_turn(self, rec: dict[str, Any], location: str, raw: Any) -> bool:
        """Validate one turn record; keep it or quarantine it. Returns True when kept."""
        issue = self.keep_turn(rec)
        if issue is not None:
            self.reject(issue, location, raw, rec)
            return False
        return True

    def keep_turn(self, rec: dict[str, Any], surrogates: bool = True) -> Issue | None:
        """Keep one turn record, or return why it cannot be kept (the caller quarantines it).
        ``surrogates=False``: the caller knows no string of ``rec`` holds a lone surrogate (a record
        decoded from UTF-8 text without a ``\\u`` escape), so the fields are not scanned for one."""
        issue = self._check_turn(rec, surrogates)
        time, extras = None, None
        if issue is None:
            time, issue = self._session_time(rec)
        if issue is None:
            value = rec.get("extras")
            if value is not None:
                extras, issue = _extras(value)
        key = (rec.get("tenant_id"), rec.get("conversation_id"), rec.get("turn_id"))
        if issue is None and key in self._seen:
            issue = (ReasonCode.DUPLICATE_TURN_ID,
                     f"turn_id {rec['turn_id']!r} already used in conversation {rec['conversation_id']!r}")
        if issue is not None:
            return issue
        self._seen.add(key)
        role = rec["role"]
        self._turns.add(rec, time, role if type(role) is str and role in ROLES else role.strip().lower(), extras)
        return None

    # -- questions -----------------------------------------------------------------------

    def add_question(self, q: dict[str, Any], location: str, raw: Any) -> bool:
        """``q`` has tenant_id, question_id, question, answer, category, evidence,
        evidence_sessions (None -> derived from the turns), question_time (raw)."""
        issue = None
        bad_field = unstorable_field(q)
        if bad_field is not None:
            issue = (ReasonCode.BAD_UNICODE, f"field {bad_field!r} holds a lone surrogate (not storable as UTF-8)")
        elif not is_id(q.get("tenant_id")) or not is_id(q.get("question_id")):
            issue = (ReasonCode.BAD_QUESTION, "question without tenant_id or question_id")
        elif not isinstance(q.get("question"), str) or not q["question"].strip():
            issue = (ReasonCode.BAD_QUESTION, "question text missing or not a non-empty string")
        elif validate_tenant_id(q["tenant_id"]):
            issue = (ReasonCode.BAD_TENANT_ID, validate_tenant_id(q["tenant_id"]))
        qtime = None
        if issue is None and q.get("question_time") not in (None, ""):
            qtime = self.parse_time(q["question_time"])
            if qtime is None:
                issue = (ReasonCode.BAD_DATE, f"unparseable question_time {str(q['question_time'])[:80]!r}")
        if issue is not None:
            self.reject(issue, location, raw, {"tenant_id": q.get("tenant_id")}, record_id=q.get("question_id"))
            return False
        evidence = q.get("evidence")
        evidence = [e if isinstance(e, str) else json.dumps(e) for e in evidence] if isinstance(evidence, list) else []
        answer = q.get("answer")
        self._questions.append({
            "tenant_id": q["tenant_id"], "question_id": q["question_id"], "question": q["question"],
            "answer": None if answer is None else str(answer),
            "category": None if q.get("category") is None else str(q["category"]),
            "evidence": evidence, "evidence_sessions": q.get("evidence_sessions"), "question_time": qtime,
        })
        return True

    # -- tables --------------------------------------------------------------------------

    def result(self) -> ReadResult:
        return self.result_with(self._turn_table(self._turns))

    def result_with(self, turns: pa.Table) -> ReadResult:
        """The tables of ``turns`` (a TURNS table of this tenant's kept turns, built here or by
        :mod:`memlib.io.columnar`) and of the questions and rejected records added."""
        return ReadResult(turns=turns, questions=self._question_table(turns), quarantine=self.quarantine.table())

    @staticmethod
    def _turn_table(rows: _TurnColumns) -> pa.Table:
        """The kept turns (``rows``, in record order) as a TURNS table: sessions ordered within their
        conversation by their first dated turn's time (undated last), then by their first record;
        turns by record order within their session; every turn takes its session's first time.
        One pass over the keys and a gather (a polars group_by/join/window over three string keys built
        row encodings of the keys in fresh pages: 0.3 s and ~40 MB for a 27k-turn tenant); none when
        the records are in that order already (a file written session after session)."""
        if not rows.text:
            return schema.empty(schema.TURNS)
        times = rows.time
        sessions: dict[tuple[str, str, str], list[Any]] = {}  # -> [first record, first time, its rows]
        for i, key in enumerate(zip(rows.tenant, rows.conv, rows.session)):
            s = sessions.get(key)
            if s is None:
                sessions[key] = [i, times[i], [i]]
            else:
                if s[1] is None:
                    s[1] = times[i]
                s[2].append(i)
        order = sorted(sessions, key=lambda k: (k[0], k[1], sessions[k][1] is None, sessions[k][1] or 0,
                                                sessions[k][0]))
        taken, time_of, session_index, turn_index = [], [], [], []
        conv, n = None, 0
        for key in order:
            n = n + 1 if key[:2] == conv else 1
            conv = key[:2]
            _, first_time, members = sessions[key]
            taken += members
            time_of += [first_time] * len(members)
            session_index += [n] * len(members)
            turn_index += range(len(members))
        in_order = taken == list(range(len(taken)))
        cols = {name: values if in_order else [values[i] for i in taken] for name, values in
                (("tenant_id", rows.tenant), ("conversation_id", rows.conv), ("session_id", rows.session),
                 ("turn_id", rows.turn), ("speaker", rows.speaker), ("role", rows.role), ("text", rows.text),
                 ("extras", rows.extras))}
        arrays = {name: pa.array(values, pa.string()) for name, values in cols.items()}
        arrays.update({
            "session_index": pa.array(session_index, pa.int32()),
            "session_time": pa.array(time_of, pa.int64()).cast(schema.TS),
            "turn_index": pa.array(turn_index, pa.int32()),
            "node_id": pa.array(ids.turn_node_ids(cols["tenant_id"], cols["conversation_id"], cols["turn_id"]),
                                pa.string()),
            "content_hash": pa.array(ids.content_hashes(cols["text"]), pa.string()),
        })
        table = pa.Table.from_arrays([arrays[f.name] for f in schema.TURNS], schema=schema.TURNS)
        return schema.conform(table, schema.TURNS, name="turns")

    def _question_table(self, turns: pa.Table) -> pa.Table:
        if not self._questions:
            return schema.empty(schema.QUESTIONS)
        pairs = turns.select(["turn_id", "session_id"]).to_pydict()
        session_of = dict(zip(pairs["turn_id"], pairs["session_id"]))
        for q in self._questions:
            if q["evidence_sessions"] is None:
                found = [session_of[e] for e in q["evidence"] if e in session_of]
                q["evidence_sessions"] = list(dict.fromkeys(found))
        return pa.Table.from_pylist(self._questions, schema=schema.QUESTIONS)
