"""Fixtures for the io area: a crafted JSONL file with one record of each bad kind."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memlib.config import IOConfig

MAX_CHARS = 200


def _turn(turn_id: str, session: str, time: str, text, **kw) -> dict:
    rec = {"tenant_id": "acme", "conversation_id": "c1", "session_id": session, "session_time": time,
           "turn_id": turn_id, "speaker": "Ana", "role": "user", "text": text}
    rec.update(kw)
    return rec


def _line(obj) -> bytes:
    return (json.dumps(obj) + "\n").encode()


GOOD = [
    _turn("t1", "s1", "2024-03-01T10:00:00Z", "I adopted a cat named Pixel yesterday."),
    _turn("t2", "s1", "2024-03-01T10:00:00Z", "Congrats! What breed?", role="assistant", speaker="bot"),
    _turn("t3", "s1", "2024-03-01T10:00:00Z", "A grey tabby.", extras={"blip_caption": "a grey cat on a sofa"}),
    _turn("t4", "s2", "2024-02-20T09:30:00+01:00", "My new job at the bakery starts Monday."),
    _turn("t5", "s2", "2024-02-20T09:30:00+01:00", "Good luck!", role="assistant"),
]
QUESTION = {"kind": "question", "tenant_id": "acme", "question_id": "acme:q1",
            "question": "What is the cat called?", "answer": "Pixel", "evidence": ["t1"], "category": "single-hop"}

BAD_KINDS = {
    "bad_json": b'{"tenant_id": "acme", "turn_id": "t9", "text": \n',
    "bad_utf8": _line(_turn("t10", "s1", "2024-03-01T10:00:00Z", "cafe")).replace(b"cafe", b"caf\xe9"),
    "missing_field": _line({k: v for k, v in _turn("t11", "s1", "2024-03-01T10:00:00Z", "hi").items()
                            if k != "turn_id"}),
    "empty_text": _line(_turn("t12", "s1", "2024-03-01T10:00:00Z", "   ")),
    "non_string_text": _line(_turn("t13", "s1", "2024-03-01T10:00:00Z", 42)),
    "bad_date": _line(_turn("t14", "s3", "the 31st of Smarch", "Lousy weather today.")),
    "duplicate_turn_id": _line(_turn("t1", "s1", "2024-03-01T10:00:00Z", "Same id again.")),
    "unknown_role": _line(_turn("t15", "s1", "2024-03-01T10:00:00Z", "beep", role="robot")),
    "oversize_turn": _line(_turn("t16", "s1", "2024-03-01T10:00:00Z", "x" * (MAX_CHARS + 1))),
    "bad_tenant_id": _line({**_turn("t17", "s1", "2024-03-01T10:00:00Z", "hi"), "tenant_id": "../etc"}),
}


@pytest.fixture
def io_cfg() -> IOConfig:
    return IOConfig(max_turn_chars=MAX_CHARS)


@pytest.fixture
def bad_jsonl(tmp_path: Path) -> Path:
    """5 good turns + 1 question of tenant acme interleaved with 10 bad records."""
    lines = [_line(GOOD[0]), _line(GOOD[1])]
    lines += list(BAD_KINDS.values())
    lines += [_line(t) for t in GOOD[2:]] + [_line(QUESTION)]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(lines))
    return path
