"""Streaming over a top-level JSON array (``ijson``): one element in memory at a time."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ijson

from memlib.io.errors import InputError

if TYPE_CHECKING:
    from memlib.config import IOConfig
    from memlib.io.result import ReadResult

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


UTF8_BOM = b"\xef\xbb\xbf"
_BOMS = ((b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe\x00\x00", "UTF-32"), (b"\xfe\xff", "UTF-16"),
         (b"\xff\xfe", "UTF-16"))


def check_head(head: bytes, path: str | Path, *, whole_file: bool) -> None:
    """Raise :class:`InputError` when the first bytes show the file is not usable UTF-8 text:
    empty (``whole_file``: ``head`` is the entire file), a UTF-16/32 byte order mark, NUL bytes."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            raise InputError(path, f"file is {name} (byte order mark); memlib reads UTF-8: convert it first, "
                                   f"e.g. iconv -f {name} -t UTF-8")
    if b"\x00" in head:
        raise InputError(path, "file holds NUL bytes: not UTF-8 text (UTF-16 without a byte order mark, or binary)")
    if whole_file and not head.lstrip(UTF8_BOM + b" \t\r\n"):
        raise InputError(path, "file is empty")


def _first_char(fh, path: Path) -> str:
    head = fh.read(_PEEK)
    check_head(head, path, whole_file=len(head) < _PEEK)
    text = head.lstrip(UTF8_BOM + b" \t\r\n")
    if not text:
        raise InputError(path, "file is empty")
    fh.seek(len(UTF8_BOM) if head.startswith(UTF8_BOM) else 0)
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
        except RecursionError:
            raise InputError(p, "JSON nested too deep to read") from None
        except ValueError as exc:  # e.g. an integer of more than 4300 digits
            raise InputError(p, f"JSON value not decodable: {str(exc)[:160]}") from None


def record_hash(record: Any) -> str:
    """sha256 of a record's canonical JSON (sorted keys): stable across runs and key order. A
    record too deep to encode is hashed by an iterative walk, so its edits still change the hash."""
    try:
        text = json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    except (RecursionError, ValueError):
        return _walk_hash(record)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _walk_hash(record: Any) -> str:
    h, stack = hashlib.sha256(b"deep:"), [record]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            h.update(b"{%d" % len(item))
            for key in sorted(item, key=str, reverse=True):
                stack += [item[key], str(key)]
        elif isinstance(item, list):
            h.update(b"[%d" % len(item))
            stack += reversed(item)
        else:
            h.update(repr(item).encode("utf-8", "surrogatepass") + b"\x1e")
    return h.hexdigest()


def checked_items(path: str | Path, marker: str, what: str) -> Iterator[tuple[int, Any]]:
    """(index, item) of a JSON array file whose first element must be an object holding
    ``marker``; otherwise the file is not a ``what`` file (one clear error, nothing read)."""
    for i, item in iter_array(path):
        if i == 0 and not (isinstance(item, dict) and marker in item):
            raise InputError(path, f"not a {what} file: first element has no {marker!r}")
        yield i, item


def fingerprints_by(items: Iterator[tuple[int, Any]], id_key: str) -> dict[str, str]:
    """Content hash of every item by its ``id_key`` (``[index]`` when it has no usable id)."""
    out: dict[str, str] = {}
    for i, item in items:
        key = item.get(id_key) if isinstance(item, dict) else None
        out[key if isinstance(key, str) and key else f"[{i}]"] = record_hash(item)
    return out


@dataclass(frozen=True)
class ArrayFormat:
    """An input format that is a JSON array of one tenant an element (LoCoMo, LongMemEval):
    ``marker`` is a key its first element must hold (else the file is not a ``what`` file),
    ``id_key`` an element's tenant id, ``tenant(item, index, source, cfg)`` its tables."""

    what: str
    marker: str
    id_key: str
    tenant: Callable[[Any, int, str, IOConfig], ReadResult]

    def iter_tenants(self, path: str | Path, cfg: IOConfig) -> Iterator[ReadResult]:
        for i, item in checked_items(path, self.marker, self.what):
            yield self.tenant(item, i, str(path), cfg)

    def fingerprints(self, path: str | Path) -> dict[str, str]:
        return fingerprints_by(checked_items(path, self.marker, self.what), self.id_key)
