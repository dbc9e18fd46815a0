"""Which input format a file is: one rule for every command (build, eval, inspect, the nightly
entrypoint) and the Python API.

A format the caller names wins. Otherwise the content decides (Parquet's magic bytes, the first
element of a JSON array, a JSON object per line), then the file name's suffix (an object storage
URI is not fetched to be looked at). A file that matches none is one :class:`InputError` naming
the formats looked for and what the file looks like; :func:`explain` adds the format a file looks
like to a reader's error when the named format was the wrong one.
"""
from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from memlib.io.errors import InputError
from memlib.io.remote import is_uri

FORMATS = ("locomo", "longmemeval", "jsonl", "parquet")
LOOKED_FOR = ("locomo (a JSON array whose elements hold 'conversation'), longmemeval (a JSON array whose "
              "elements hold 'haystack_sessions'), jsonl (one JSON object per line), parquet")
SUFFIX_FORMAT = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
_HEAD = 1 << 16  # bytes read to judge a JSON Lines file
_LINES = 20      # non-empty lines of it looked at for one JSON object


def sniff(path: str | Path) -> tuple[str | None, str]:
    """(format, what the file looks like) of a local file, from its first bytes; the format is
    None when the content matches none of :data:`FORMATS`."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            head = fh.read(_HEAD)
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if head.startswith(b"PAR1"):
        return "parquet", "a Parquet file"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text:
        return None, "an empty file"
    if text[:1] == b"[":
        return _sniff_array(p)
    if text[:1] == b"{":
        for line in [ln for ln in head.splitlines() if ln.strip()][:_LINES]:
            try:
                if isinstance(json.loads(line.lstrip(b"\xef\xbb\xbf")), dict):
                    return "jsonl", "jsonl (one JSON object per line)"
            except ValueError:
                continue
        return None, "one JSON object spread over several lines (not one object per line)"
    return None, "neither JSON nor Parquet"


def _sniff_array(p: Path) -> tuple[str | None, str]:
    from memlib.io.jsonarray import iter_array

    try:
        first = next(iter(iter_array(p)), (0, None))[1]
    except InputError as exc:
        return None, f"a JSON array that cannot be read ({exc.reason})"
    if isinstance(first, dict) and "conversation" in first:
        return "locomo", "LoCoMo (a JSON array of samples with 'conversation')"
    if isinstance(first, dict) and "haystack_sessions" in first:
        return "longmemeval", "LongMemEval (a JSON array with 'haystack_sessions')"
    return None, "a JSON array whose first element holds neither 'conversation' nor 'haystack_sessions'"


def _by_suffix(name: str) -> str | None:
    return SUFFIX_FORMAT.get(PurePosixPath(name.split("?", 1)[0]).suffix.lower())


def detect_format(path: str | Path, fmt: str | None = None) -> str:
    """The format to read ``path`` with: ``fmt`` when given (a known name), else detected. A
    directory's format is that of its input files (the files a nightly build reads)."""
    if fmt:
        name = str(getattr(fmt, "value", fmt))
        if name not in FORMATS:
            raise InputError(path, f"unknown format {name!r}; choose one of {', '.join(FORMATS)}")
        return name
    if is_uri(path):
        guess = _by_suffix(str(path))
        if guess is None:
            raise InputError(path, f"cannot tell the format of an object storage URI from its name; pass "
                                   f"--format (format=) {' | '.join(FORMATS)}")
        return guess
    p = Path(path)
    if p.is_dir():
        return _directory_format(p)
    if not p.exists():
        raise InputError(p, "file not found")
    found, looks = sniff(p)
    guess = found or _by_suffix(p.name)
    if guess is None:
        raise InputError(p, f"cannot tell the input format: looked for {LOOKED_FOR}; the file is {looks}. "
                            f"Pass --format (format=) if it is one of these")
    return guess


def _directory_format(p: Path) -> str:
    files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
    found = {_by_suffix(f.name) or (sniff(f)[0] if f.suffix.lower() == ".json" else None) for f in files}
    found.discard(None)
    if len(found) != 1:
        what = f"files of {len(found)} formats ({', '.join(sorted(found))})" if found else "no input file"
        raise InputError(p, f"cannot tell the input format of a directory holding {what}; pass --format "
                            f"(format=) {' | '.join(FORMATS)}")
    return found.pop()


def explain(exc: InputError, path: str | Path, fmt: str | None) -> str:
    """A reader's error as one line; when the file looks like another format than ``fmt``, the
    line says which, and that naming it (or no format at all) reads the file."""
    line = str(exc)
    if not fmt or is_uri(path) or not Path(path).is_file():
        return line
    found, looks = sniff(path)
    if found and found != str(getattr(fmt, "value", fmt)):
        return f"{line} (read as {fmt}; the file looks like {looks}: pass --format {found}, or leave it out)"
    return line
