"""LongMemEval reader: one tenant per instance (``question_id``).

Original schema: question_id, question_type, question, answer, question_date,
haystack_session_ids / haystack_dates / haystack_sessions (turns with role, content and
``has_answer``), answer_session_ids. Turn ids are ``"<session_id>:<j>"``; turns flagged
``has_answer`` carry ``{"has_answer": true}`` in extras and are the question's evidence.

Third-party variant (``questions[]``, ``answers[]``, ``answer_session_ids[]`` lists, as in
``longmemeval_s_3haystacks_thirdparty_modified.json``): one question per list entry, ids
``"<question_id>:<i>"``. Caveat: the has_answer flags belong to the ORIGINAL question only,
so for the added questions evidence holds only flagged turns inside their answer sessions
(often none) and evidence_sessions is the only ground truth; most added questions are about
filler sessions. Use this variant for ingestion scale, not as QA ground truth.
"""
from __future__ import annotations

from typing import Any

from memlib.config import IOConfig
from memlib.io.builder import TenantBuilder
from memlib.io.jsonarray import ArrayFormat
from memlib.io.result import ReadResult
from memlib.io.validate import ReasonCode, is_id, parse_longmemeval_time


def _turn_record(qid: str, session_id: str, date: Any, j: int, turn: dict[str, Any]) -> dict[str, Any]:
    rec = {"tenant_id": qid, "conversation_id": qid, "session_id": session_id, "session_time": date,
           "turn_id": f"{session_id}:{j}", "speaker": turn.get("role"), "role": turn.get("role"),
           "extras": {"has_answer": True} if turn.get("has_answer") is True else None}
    if "content" in turn:
        rec["text"] = turn["content"]
    return rec


def _add_sessions(b: TenantBuilder, qid: str, item: dict[str, Any]) -> dict[str, list[str]]:
    """Add every turn; return the kept has_answer turn ids per session."""
    ids, dates, sessions = (item.get(k) or [] for k in ("haystack_session_ids", "haystack_dates",
                                                         "haystack_sessions"))
    flagged: dict[str, list[str]] = {}
    owner = {"tenant_id": qid, "conversation_id": qid}
    for i, turns in enumerate(sessions):
        sid = ids[i] if i < len(ids) else None
        where = f"{qid}.haystack_sessions[{i}]"
        if not is_id(sid) or i >= len(dates) or not isinstance(turns, list):
            b.reject((ReasonCode.BAD_SESSION, "session without id, date or list of turns"), where,
                     turns, owner, record_id=sid)
            continue
        for j, turn in enumerate(turns):
            if not isinstance(turn, dict):
                b.reject((ReasonCode.NOT_OBJECT, "turn is not an object"), f"{where}[{j}]", turn, owner)
                continue
            rec = _turn_record(qid, sid, dates[i], j, turn)
            if b.add_turn(rec, f"{where}[{j}]", turn) and rec["extras"]:
                flagged.setdefault(sid, []).append(rec["turn_id"])
    return flagged


def _questions(qid: str, item: dict[str, Any], flagged: dict[str, list[str]]) -> list[dict[str, Any]]:
    base = {"tenant_id": qid, "category": item.get("question_type"), "question_time": item.get("question_date")}
    if isinstance(item.get("questions"), list):
        answers, sessions = item.get("answers") or [], item.get("answer_session_ids") or []
        out = []
        for i, question in enumerate(item["questions"]):
            ans_sessions = sessions[i] if i < len(sessions) and isinstance(sessions[i], list) else []
            out.append({**base, "question_id": f"{qid}:{i}", "question": question,
                        "answer": answers[i] if i < len(answers) else None,
                        "evidence": [t for s in ans_sessions for t in flagged.get(s, [])],
                        "evidence_sessions": [str(s) for s in ans_sessions]})
        return out
    ans_sessions = [str(s) for s in item.get("answer_session_ids") or []]
    return [{**base, "question_id": qid, "question": item.get("question"), "answer": item.get("answer"),
             "evidence": [t for ts in flagged.values() for t in ts], "evidence_sessions": ans_sessions}]


def instance_result(item: Any, index: int, source: str, cfg: IOConfig) -> ReadResult:
    """Validated tables of one LongMemEval instance."""
    b = TenantBuilder(source, cfg, parse_longmemeval_time, require_time=True)
    qid = item.get("question_id") if isinstance(item, dict) else None
    if not is_id(qid) or not isinstance(item.get("haystack_sessions"), list):
        b.reject((ReasonCode.MISSING_FIELD, "instance without question_id or haystack_sessions list"),
                 f"[{index}]", item)
        return b.result()
    flagged = _add_sessions(b, qid, item)
    for i, q in enumerate(_questions(qid, item, flagged)):
        b.add_question(q, f"{qid}.question[{i}]", q)
    return b.result()


LONGMEMEVAL = ArrayFormat("LongMemEval", marker="haystack_sessions", id_key="question_id", tenant=instance_result)
iter_tenants = LONGMEMEVAL.iter_tenants
fingerprints = LONGMEMEVAL.fingerprints
