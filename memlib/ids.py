"""Deterministic content-hash ids: the one definition used everywhere.

An id is ``"<kind>:<hex>"`` where ``hex`` is the first 20 hex digits (80 bits) of the
BLAKE2b digest of the id's parts joined by the unit separator. The same inputs give the
same id on every machine and every run, so retries and reruns are idempotent.

Parts are encoded unambiguously: inside a part, the unit separator, NUL and ESC are escaped
with ESC, and ``None`` is a lone NUL, so ``("c\x1fx", "s1")`` and ``("c", "x\x1fs1")`` differ.
Parts without those three characters (every ordinary id and text) encode as before.
"""
from __future__ import annotations

import hashlib

_SEP = "\x1f"
HEX_LEN = 20
_ESC = {0x1b: b"\x1b\x1b", 0x1f: b"\x1b\x1f", 0x1e: b"\x1b\x1e", 0x00: b"\x1b\x00"}
_SPECIAL = bytes(_ESC)


def escape(raw: bytes) -> bytes:
    """``raw`` with the separators (\\x1e, \\x1f), NUL and ESC escaped by ESC: joining escaped
    parts with a separator is unambiguous; bytes without them are returned unchanged."""
    if not any(c in raw for c in _SPECIAL):
        return raw
    return b"".join(_ESC.get(c, bytes((c,))) for c in raw)


def _part(p: object) -> bytes:
    return b"\x00" if p is None else escape(str(p).encode("utf-8", "surrogatepass"))


def digest(*parts: object, length: int = HEX_LEN) -> str:
    """Hex digest of the parts (``None`` is encoded distinctly from the empty string)."""
    h = hashlib.blake2b(digest_size=16)
    for i, p in enumerate(parts):
        if i:
            h.update(_SEP.encode())
        h.update(_part(p))
    return h.hexdigest()[:length]


def make_id(kind: str, *parts: object) -> str:
    """Id of a node (or other record) of ``kind`` identified by ``parts``."""
    kind = getattr(kind, "value", kind)
    return f"{kind}:{digest(kind, *parts)}"


def turn_node_id(tenant_id: str, conversation_id: str, turn_id: str) -> str:
    return make_id("turn", tenant_id, conversation_id, turn_id)


def session_node_id(tenant_id: str, conversation_id: str, session_id: str) -> str:
    return make_id("session", tenant_id, conversation_id, session_id)


def content_hash(text: str) -> str:
    return digest(text, length=32)

