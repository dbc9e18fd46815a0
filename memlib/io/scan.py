"""Tolerant reading of one field of a raw record that ``json`` cannot decode.

A rejected line (truncated JSON, invalid UTF-8, nested too deep to decode) still says whose it
is: its quarantine row keeps that tenant, so forgetting the tenant removes the row too. The
scanner walks the record's top-level tokens with a regular expression (no recursion, no
object built), so a record nested 100,000 deep costs one linear pass.
"""
from __future__ import annotations

import json
import re
from typing import Any

_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|[{}\[\]:,]')
_SCAN_LIMIT = 1 << 20  # characters of a raw record the scanner looks at


def _string(token: str) -> str | None:
    try:
        value = json.loads(token)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def top_level_string(raw: Any, key: str) -> str | None:
    """The string value of ``key`` in the top-level object of ``raw`` (bytes or text), read
    as far as the record is well-formed; ``None`` when absent, not a string or unreadable."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, (bytes, bytearray)) else str(raw)
    text = text[:_SCAN_LIMIT].lstrip("\ufeff \t\r\n")
    if not text.startswith("{"):
        return None
    depth, after_colon, is_key, last = 0, False, False, None
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok[0] == '"':
            if depth == 1 and after_colon:
                if is_key:
                    return _string(tok)
                after_colon = False
            elif depth == 1:
                last = tok
        elif tok in "{[":
            after_colon = after_colon and depth != 1
            depth += 1
        elif tok in "}]":
            depth -= 1
            if depth <= 0:
                return None
        elif tok == ":" and depth == 1:
            after_colon, is_key = True, last is not None and _string(last) == key
        elif tok == "," and depth == 1:
            after_colon, last = False, None
    return None


MAX_DEPTH = 100  # records nested deeper are refused whatever Python's recursion limit is


def too_deep(raw: str | bytes, limit: int = MAX_DEPTH) -> bool:
    """True when ``raw`` (JSON text) nests objects/arrays deeper than ``limit``. Cheap for
    ordinary records: the exact walk runs only when the text holds more than ``limit`` brackets."""
    square, curly = (b"[", b"{") if isinstance(raw, bytes) else ("[", "{")
    if limit >= 1 and square not in raw and raw.find(curly, 1) < 0:  # one bracket at most: two memchr
        return False  # scans, where counting the brackets was a pass per kind (a record's 2 us)
    opening = raw.count(square) + raw.count(curly)
    if opening <= limit:
        return False
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    depth = 0
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok in "{[":
            depth += 1
            if depth > limit:
                return True
        elif tok in "}]":
            depth -= 1
    return False
