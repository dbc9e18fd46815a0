"""``TenantBuilder``: validates turn and question records of one tenant and builds the
``turns`` / ``questions`` / ``quarantine`` tables. Every format reader maps its records to
plain dicts and hands them here, so the validation rules exist once."""
from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import polars as pl
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
_TURN_COLUMNS = ("tenant_id", "conversation_id", "session_id", "session_time", "turn_id",
                 "speaker", "role", "text", "extras", "_seq")


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


class TenantBuilder:
    """Collects one tenant's records; ``result()`` returns the validated tables."""

    def __init__(self, source: str, cfg: IOConfig, parse_time: TimeParser, *, require_time: bool):
        self.cfg = cfg
        self.parse_time = parse_time
        self.require_time = require_time
        self.quarantine = Quarantine(source)
        self._turns: list[dict[str, Any]] = []
        self._questions: list[dict[str, Any]] = []
        self._seen: set[tuple[str, str, str]] = set()

    # -- turns ---------------------------------------------------------------------------

    def reject(self, issue: Issue, location: str, raw: Any, rec: dict[str, Any] | None = None,
               record_id: Any = None) -> None:
        rec = rec or {}
        tenant = rec.get("tenant_id") if issue[0] is not ReasonCode.BAD_TENANT_ID else None
        self.quarantine.add(issue, location, raw, tenant_id=tenant,
                            conversation_id=rec.get("conversation_id"),
                            record_id=record_id if record_id is not None else rec.get("turn_id"))

    def _check_turn(self, rec: dict[str, Any]) -> Issue | None:
        bad_field = unstorable_field(rec)
        if bad_field is not None:
            return ReasonCode.BAD_UNICODE, f"field {bad_field!r} holds a lone surrogate (not storable as UTF-8)"
        missing = [k for k in ID_FIELDS if not is_id(rec.get(k))]
        if missing:
            return ReasonCode.MISSING_FIELD, f"missing or empty id field(s): {', '.join(missing)}"
        bad_tenant = validate_tenant_id(rec["tenant_id"])
        if bad_tenant:
            return ReasonCode.BAD_TENANT_ID, bad_tenant
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
        if role is None or (isinstance(role, str) and not role.strip()):
            return ReasonCode.MISSING_FIELD, f"missing field: role (one of {sorted(ROLES)})"
        if not isinstance(role, str) or role.strip().lower() not in ROLES:
            return ReasonCode.UNKNOWN_ROLE, f"role {role!r} is not one of {sorted(ROLES)}"
        return None

    def _session_time(self, rec: dict[str, Any]) -> tuple[datetime | None, Issue | None]:
        value = rec.get("session_time")
        if value is None or value == "":
            if self.require_time:
                return None, (ReasonCode.BAD_DATE, "session has no date")
            return None, None
        parsed = self.parse_time(value)
        if parsed is None:
            return None, (ReasonCode.BAD_DATE, f"unparseable session_time {str(value)[:80]!r} (ISO 8601, years "
                                               f"{YEARS[0]}-{YEARS[1]})")
        return parsed, None

    def add_turn(self, rec: dict[str, Any], location: str, raw: Any) -> bool:
        """Validate one turn record; keep it or quarantine it. Returns True when kept."""
        issue = self._check_turn(rec)
        time, extras = None, None
        if issue is None:
            time, issue = self._session_time(rec)
        if issue is None:
            extras, issue = _extras(rec.get("extras"))
        key = (rec.get("tenant_id"), rec.get("conversation_id"), rec.get("turn_id"))
        if issue is None and key in self._seen:
            issue = (ReasonCode.DUPLICATE_TURN_ID,
                     f"turn_id {rec['turn_id']!r} already used in conversation {rec['conversation_id']!r}")
        if issue is not None:
            self.reject(issue, location, raw, rec)
            return False
        self._seen.add(key)
        speaker = rec.get("speaker")
        self._turns.append({
            "tenant_id": rec["tenant_id"], "conversation_id": rec["conversation_id"],
            "session_id": rec["session_id"], "session_time": time, "turn_id": rec["turn_id"],
            "speaker": speaker if isinstance(speaker, str) else None,
            "role": rec["role"].strip().lower(), "text": rec["text"], "extras": extras,
            "_seq": len(self._turns),
        })
        return True

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
        turns = self._turn_table(self._turns)
        return ReadResult(turns=turns, questions=self._question_table(turns),
                          quarantine=self.quarantine.table())

    @staticmethod
    def _turn_table(rows: list[dict[str, Any]]) -> pa.Table:
        if not rows:
            return schema.empty(schema.TURNS)
        cols = {c: [r[c] for r in rows] for c in _TURN_COLUMNS}
        df = pl.DataFrame(cols, schema_overrides={"session_time": pl.Datetime("us", "UTC")})
        sessions = (df.group_by(["tenant_id", "conversation_id", "session_id"])
                    .agg(pl.col("session_time").drop_nulls().first(), pl.col("_seq").min().alias("_first"))
                    .sort(["tenant_id", "conversation_id", "session_time", "_first"], nulls_last=True)
                    .with_columns((pl.int_range(pl.len()).over(["tenant_id", "conversation_id"]) + 1)
                                  .cast(pl.Int32).alias("session_index")))
        df = (df.drop("session_time")
              .join(sessions, on=["tenant_id", "conversation_id", "session_id"], how="left")
              .with_columns((pl.col("_seq").rank("ordinal").over(["tenant_id", "conversation_id", "session_id"]) - 1)
                            .cast(pl.Int32).alias("turn_index"))
              .sort(["tenant_id", "conversation_id", "session_index", "turn_index"]))
        keys = df.select(["tenant_id", "conversation_id", "turn_id"]).rows()
        df = df.with_columns(
            pl.Series("node_id", [ids.turn_node_id(*k) for k in keys], dtype=pl.String),
            pl.Series("content_hash", [ids.content_hash(t) for t in df.get_column("text").to_list()],
                      dtype=pl.String),
        )
        return schema.conform(df.to_arrow(), schema.TURNS, name="turns")

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
