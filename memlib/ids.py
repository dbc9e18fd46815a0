"""Deterministic content-hash ids: the one definition used everywhere.

An id is ``"<kind>:<hex>"`` where ``hex`` is the first 20 hex digits (80 bits) of the
BLAKE2b digest of the id's parts joined by the unit separator. The same inputs give the
same id on every machine and every run, so retries and reruns are idempotent.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

_SEP = "\x1f"
HEX_LEN = 20


def digest(*parts: object, length: int = HEX_LEN) -> str:
    """Hex digest of the parts (``None`` is encoded distinctly from the empty string)."""
    h = hashlib.blake2b(digest_size=16)
    for i, p in enumerate(parts):
        if i:
            h.update(_SEP.encode())
        h.update(b"\x00" if p is None else str(p).encode("utf-8", "surrogatepass"))
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


def kind_of(node_id: str) -> str:
    return node_id.split(":", 1)[0]


def make_ids(kind: str, rows: Iterable[Sequence[object]]) -> list[str]:
    """Vector form of :func:`make_id` over rows of parts."""
    return [make_id(kind, *r) for r in rows]
