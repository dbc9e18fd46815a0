"""LoCoMo reader (``locomo10.json`` schema): one tenant per ``sample_id``.

Mapping: tenant_id = conversation_id = sample_id; ``session_N`` -> session_id ``session_N``
with its ``session_N_date_time`` ("1:56 pm on 8 May, 2023", read as UTC); turn_id = dia_id;
role = ``user`` for both speakers (both are human participants whose facts are memory, so
neither is an assistant); image fields (img_url, blip_caption, query) go to extras.
"""
from __future__ import annotations

import re
from typing import Any

from memlib.config import IOConfig
from memlib.io.builder import TenantBuilder
from memlib.io.jsonarray import ArrayFormat
from memlib.io.result import ReadResult
from memlib.io.validate import ReasonCode, is_id, parse_locomo_time

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_EVIDENCE_SESSION = re.compile(r"D(\d+)\s*:")
IMAGE_FIELDS = ("img_url", "blip_caption", "query")


def _sessions(conv: dict[str, Any]) -> list[tuple[int, str]]:
    found = [(int(m.group(1)), k) for k in conv if (m := _SESSION_KEY.fullmatch(k))]
    return sorted(found)


def _turn_record(sid: str, key: str, date: Any, turn: dict[str, Any]) -> dict[str, Any]:
    rec = {"tenant_id": sid, "conversation_id": sid, "session_id": key, "session_time": date,
           "turn_id": turn.get("dia_id"), "speaker": turn.get("speaker"), "role": "user",
           "extras": {k: turn[k] for k in IMAGE_FIELDS if k in turn} or None}
    if "text" in turn:
        rec["text"] = turn["text"]
    return rec


def _add_sessions(b: TenantBuilder, sid: str, conv: dict[str, Any]) -> None:
    for _, key in _sessions(conv):
        turns = conv[key]
        if not isinstance(turns, list):
            b.reject((ReasonCode.BAD_SESSION, f"{key} is not a list of turns"), f"{sid}.{key}", turns,
                     {"tenant_id": sid, "conversation_id": sid}, record_id=key)
            continue
        date = conv.get(f"{key}_date_time")
        for j, turn in enumerate(turns):
            where = f"{sid}.{key}[{j}]"
            if not isinstance(turn, dict):
                b.reject((ReasonCode.NOT_OBJECT, "turn is not an object"), where, turn,
                         {"tenant_id": sid, "conversation_id": sid})
                continue
            b.add_turn(_turn_record(sid, key, date, turn), where, turn)


def evidence_sessions(evidence: list[Any]) -> list[str]:
    """``["D3:5", "D8:6; D9:17"]`` -> ``["session_3", "session_8", "session_9"]``."""
    found = [f"session_{n}" for e in evidence if isinstance(e, str) for n in _EVIDENCE_SESSION.findall(e)]
    return list(dict.fromkeys(found))


def _add_questions(b: TenantBuilder, sid: str, qa: Any) -> None:
    for i, q in enumerate(qa if isinstance(qa, list) else []):
        where = f"{sid}.qa[{i}]"
        if not isinstance(q, dict):
            b.reject((ReasonCode.NOT_OBJECT, "question is not an object"), where, q, {"tenant_id": sid})
            continue
        evidence = q.get("evidence") if isinstance(q.get("evidence"), list) else []
        b.add_question({
            "tenant_id": sid, "question_id": f"{sid}:q{i}", "question": q.get("question"),
            "answer": q["answer"] if "answer" in q else q.get("adversarial_answer"),
            "category": q.get("category"), "evidence": evidence,
            "evidence_sessions": evidence_sessions(evidence),
        }, where, q)


def sample_result(item: Any, index: int, source: str, cfg: IOConfig) -> ReadResult:
    """Validated tables of one LoCoMo sample."""
    b = TenantBuilder(source, cfg, parse_locomo_time, require_time=True)
    sid = item.get("sample_id") if isinstance(item, dict) else None
    conv = item.get("conversation") if isinstance(item, dict) else None
    if not is_id(sid) or not isinstance(conv, dict):
        b.reject((ReasonCode.MISSING_FIELD, "sample without sample_id or conversation object"),
                 f"[{index}]", item)
        return b.result()
    _add_sessions(b, sid, conv)
    _add_questions(b, sid, item.get("qa"))
    return b.result()


LOCOMO = ArrayFormat("LoCoMo", marker="conversation", id_key="sample_id", tenant=sample_result)
iter_tenants = LOCOMO.iter_tenants
fingerprints = LOCOMO.fingerprints
