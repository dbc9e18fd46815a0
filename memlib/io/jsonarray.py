"""Streaming over a top-level JSON array (``ijson``): one element in memory at a time."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ijson

from memlib.io.errors import InputError

_PEEK = 4096


def open_checked(path: str | Path):
    """Open ``path`` for binary reading or raise :class:`InputError`."""
    p = Path(path)
    if not p.exists():
        raise InputError(p, "file not found")
    if not p.is_file():
        raise InputError(p, "not a regular file")
    try:
        return p.open("rb")
    except OSError as exc:
        raise InputError(p, f"cannot open: {exc.strerror or exc}") from exc


def _first_char(fh, path: Path) -> str:
    head = fh.read(_PEEK)
    fh.seek(0)
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text:
        raise InputError(path, "file is empty")
    return chr(text[0])


def iter_array(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, element)`` of the file's top-level JSON array."""
    p = Path(path)
    with open_checked(p) as fh:
        first = _first_char(fh, p)
        if first != "[":
            what = "a JSON object" if first == "{" else "not JSON"
            raise InputError(p, f"expected a JSON array at top level, found {what}")
        try:
            yield from enumerate(ijson.items(fh, "item", use_float=True))
        except ijson.JSONError as exc:
            raise InputError(p, f"malformed JSON: {str(exc).splitlines()[0][:200]}") from exc
        except UnicodeDecodeError as exc:
            raise InputError(p, f"not valid UTF-8: {exc.reason}") from exc


def record_hash(record: Any) -> str:
    """sha256 of a record's canonical JSON (sorted keys): stable across runs and key order."""
    text = json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
