"""Generic JSONL reader (format in FORMAT.md) and the record dispatch shared with Parquet.

Streaming by tenant: a first pass reads the file line by line and records, per tenant,
the byte ranges ("runs") of its consecutive lines, plus a sha256 per run. A second pass
seeks to each tenant's runs, so rows of one tenant may be spread across the file and memory
holds one tenant's records plus the run index (one entry per tenant when the file is
grouped by tenant, the recommended layout; at worst one entry per line). Lines whose
tenant cannot be read (bad JSON, bad UTF-8, a missing or invalid tenant_id) belong to the
run they appear in, so they are quarantined with that tenant's records.

Each line is decoded once: the first pass decodes lines only until the field tally is settled
(every required field seen), then reads a line's tenant off its first key when that is exact
(``_first_tenant``); the second pass decodes and validates every record.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memlib.config import IOConfig
from memlib.io.builder import TenantBuilder
from memlib.io.columnar import read_columnar
from memlib.io.errors import InputError
from memlib.io.fields import REQUIRED, VALID_ROLE, FieldTally
from memlib.io.jsonarray import UTF8_BOM, check_head, open_checked
from memlib.io.result import ReadResult
from memlib.io.scan import MAX_DEPTH, too_deep, top_level_string
from memlib.io.validate import ReasonCode, parse_iso_time, validate_tenant_id

TURN_KIND, QUESTION_KIND = "turn", "question"


@dataclass
class _Run:
    start: int
    first_line: int
    end: int = 0
    sha: Any = field(default_factory=hashlib.sha256)


def _valid(tenant: object) -> str | None:
    return tenant if isinstance(tenant, str) and validate_tenant_id(tenant) is None else None


def raw_tenant(raw: bytes | str) -> str | None:
    """The valid tenant id a record that cannot be decoded names, if it can be read at all."""
    return _valid(top_level_string(raw, "tenant_id"))


def _line_tenant(line: bytes, tally: FieldTally | None = None) -> tuple[bool, str | None]:
    """(line is a JSON object, its valid tenant id or None). A line that cannot be decoded
    (bad UTF-8, broken JSON, nested too deep) still belongs to the tenant it names. ``tally``
    counts the fields of each decoded record."""
    try:
        if too_deep(line):
            raise RecursionError
        obj = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False, raw_tenant(line)
    if not isinstance(obj, dict):
        return False, None
    if tally is not None:
        tally.add(obj)
    return True, _valid(obj.get("tenant_id"))


# a line that opens with a valid tenant_id as its first key. When the line names no other
# "tenant_id" and holds no \u escape of an ASCII letter or "_" (which could spell a second one),
# that is the tenant _line_tenant finds: the record's key when it decodes (json keeps a duplicate
# key's last value, and there is none), the first top-level one of raw_tenant when it does not
_FIRST_TENANT = re.compile(rb'\{[ \t\r\n]*"tenant_id"[ \t\r\n]*:[ \t\r\n]*"([A-Za-z0-9][A-Za-z0-9._-]{0,127})"')
_ASCII_ESCAPE = re.compile(rb"\\u00[4-7]")


def _first_tenant(line: bytes) -> str | None:
    """The tenant of ``line`` read off its first key, or None when only decoding can tell."""
    m = _FIRST_TENANT.match(line)
    if m is None or line.count(b'"tenant_id"') != 1 or _ASCII_ESCAPE.search(line):
        return None
    return m.group(1).decode("ascii")


def _tallied(tally: FieldTally) -> bool:
    """Every required field and a valid role seen: :meth:`FieldTally.problem` is None whatever
    records follow, so the rest need not be decoded for it."""
    return tally.turns > 0 and tally.holding[VALID_ROLE] > 0 and all(tally.holding[k] for k in REQUIRED)


def _check_start(fh, path: str | Path) -> None:
    head = fh.read(4096)
    fh.seek(0)
    check_head(head, path, whole_file=len(head) < 4096)


MAX_RECORD_BYTES = 16 << 20  # a longer line is quarantined without ever being held whole
_DRAIN = 1 << 20


def _read_line(fh) -> tuple[bytes, int, bytes]:
    """(line, its full size, what the run hash takes). A line longer than MAX_RECORD_BYTES comes
    back cut to that size, read through in chunks; the hash then takes its own digest."""
    line = fh.readline(MAX_RECORD_BYTES + 1)
    if len(line) <= MAX_RECORD_BYTES or line.endswith(b"\n"):
        return line, len(line), line
    digest, size = hashlib.sha256(line), len(line)
    while more := fh.readline(_DRAIN):
        digest.update(more)
        size += len(more)
        if more.endswith(b"\n"):
            break
    return line[:MAX_RECORD_BYTES], size, b"\x00oversize:" + digest.digest()


def _no_bom(line: bytes, offset: int) -> bytes:
    return line[len(UTF8_BOM):] if offset == 0 and line.startswith(UTF8_BOM) else line


# the run indexes of the files read last: a build's fingerprint pass indexes each file, then its
# sharding reads the same file by that index (a second index pass was a third of the reading).
# Keyed by the file's identity and size and mtime: a file written since is indexed again (and one
# changed without either changing is caught by the runs' hashes, as within one read)
_INDEXES: OrderedDict[tuple, dict[str | None, list[_Run]]] = OrderedDict()
_INDEXES_LOCK = threading.Lock()
INDEX_CACHE_RUNS = 200_000  # runs kept over all cached files (a run is about 300 bytes)


def _file_key(path: str | Path) -> tuple:
    st = os.stat(path)
    return str(Path(path).absolute()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def index_runs(path: str | Path) -> dict[str | None, list[_Run]]:
    """First pass: tenant -> its runs of consecutive lines (byte ranges), in file order. The index
    of a file unchanged since it was last indexed is that one (the caller must not alter it)."""
    try:
        key = _file_key(path)
    except OSError:
        key = None
    with _INDEXES_LOCK:
        if key in _INDEXES:
            _INDEXES.move_to_end(key)
            return _INDEXES[key]
    runs = _index_runs(path)
    size = sum(len(r) for r in runs.values())
    if key is not None and size <= INDEX_CACHE_RUNS:
        with _INDEXES_LOCK:
            _INDEXES[key] = runs
            while sum(len(r) for idx in _INDEXES.values() for r in idx.values()) > INDEX_CACHE_RUNS:
                _INDEXES.popitem(last=False)
    return runs


def _index_runs(path: str | Path) -> dict[str | None, list[_Run]]:
    runs: dict[str | None, list[_Run]] = {}
    run, owner, offset, any_object = None, None, 0, False
    tally, tallied = FieldTally(), False
    with open_checked(path) as fh:
        _check_start(fh, path)
        lineno = 0
        while True:
            line, size, feed = _read_line(fh)
            if not size:
                break
            lineno += 1
            content = _no_bom(line, offset)
            if size > len(line):
                is_object, tenant = False, raw_tenant(content)
            elif tallied and (tenant := _first_tenant(content)) is not None:
                is_object = True  # (if it does not decode, it still names a tenant: any_object is moot)
            else:
                is_object, tenant = _line_tenant(content, tally) if content.strip() else (False, None)
                tallied = tallied or (is_object and _tallied(tally))
            any_object = any_object or is_object
            if run is None or (tenant is not None and owner is not None and tenant != owner):
                run, owner = _Run(start=offset, first_line=lineno), tenant
                if owner is not None:
                    runs.setdefault(owner, []).append(run)
            elif owner is None and tenant is not None:  # leading tenant-less lines join the first tenant
                owner = tenant
                runs.setdefault(owner, []).append(run)
            run.sha.update(feed)
            offset += size
            run.end = offset
    if run is None:
        raise InputError(path, "file is empty")
    problem = tally.problem()  # e.g. every turn has `content` where memlib reads `text`: nothing would be kept
    if problem:
        raise InputError(path, problem)
    if run is not None and owner is None:
        if not any_object:
            raise InputError(path, "no line is a JSON object: not a JSONL file")
        raise InputError(path, "no record has a valid tenant_id: nothing to read")
    return runs


def question_record(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: obj.get(k) for k in ("tenant_id", "question_id", "question", "answer", "category",
                                    "evidence", "evidence_sessions", "question_time")}


def add_object(b: TenantBuilder, obj: Any, where: str, raw: Any) -> None:
    """Dispatch one decoded record (turn or question) to the builder."""
    if not isinstance(obj, dict):
        b.reject((ReasonCode.NOT_OBJECT, f"record is a JSON {type(obj).__name__}, not an object"), where, raw)
        return
    kind = obj.get("kind") or TURN_KIND
    if kind == TURN_KIND:
        b.add_turn(obj, where, raw)
    elif kind == QUESTION_KIND:
        b.add_question(question_record(obj), where, raw)
    else:
        b.reject((ReasonCode.UNKNOWN_KIND, f"kind {str(kind)[:40]!r} is not 'turn' or 'question'"),
                 where, raw, obj)


_SCAN = json.JSONDecoder().scan_once  # what json.loads runs, configured as json.loads configures it


def _decode(text: str) -> Any:
    """``json.loads(text)``: the scanner called directly for a record that starts at the line's first
    character and ends at its newline (every well-formed line; json.loads's checks and whitespace
    matching were a third of its time); any other line, and any error, is json.loads's own."""
    try:
        obj, end = _SCAN(text, 0)
    except Exception:  # noqa: BLE001 - json.loads raises its own error for the line
        return json.loads(text)
    if end == len(text) or text[end:] in ("\n", "\r\n"):
        return obj
    return json.loads(text)


def _add_line(b: TenantBuilder, line: bytes, lineno: int) -> None:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        b.reject((ReasonCode.BAD_UTF8, f"invalid UTF-8 byte at position {exc.start}"), f"line {lineno}", line,
                 {"tenant_id": raw_tenant(line)})
        return
    if not text.strip():
        return
    try:
        if too_deep(line):  # the same brackets as in text
            raise RecursionError
        obj = _decode(text)
    except json.JSONDecodeError as exc:
        b.reject((ReasonCode.BAD_JSON, f"not JSON: {exc.msg} (column {exc.colno})"), f"line {lineno}", text,
                 {"tenant_id": raw_tenant(text)})
        return
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        b.reject((ReasonCode.BAD_JSON, f"not decodable: {str(exc)[:120]}"), f"line {lineno}", text,
                 {"tenant_id": raw_tenant(text)})
        return
    except RecursionError:
        b.reject((ReasonCode.TOO_DEEP, f"record nested deeper than {MAX_DEPTH} levels"), f"line {lineno}", text,
                 {"tenant_id": raw_tenant(text)})
        return
    if type(obj) is dict and (obj.get("kind") or TURN_KIND) == TURN_KIND:
        # a lone surrogate comes from a \ud800-\udfff escape only (UTF-8 text cannot hold one)
        issue = b.keep_turn(obj, surrogates=b"\\u" in line and ("\\ud" in text or "\\uD" in text))
        if issue is not None:
            b.reject(issue, f"line {lineno}", text.rstrip("\n"), obj)
        return
    add_object(b, obj, f"line {lineno}", text.rstrip("\n"))


def _changed(path: str, offset: int, run: _Run, detail: str) -> InputError:
    return InputError(path, f"file changed while it was read ({detail} at byte {offset}; the first pass "
                            f"indexed bytes {run.start}-{run.end}): rerun on a file that is not being written")


def _tenant_result(fh, runs: list[_Run], source: str, cfg: IOConfig) -> ReadResult:
    read = read_columnar(fh, runs, source, cfg, _add_line)  # Arrow's decoding, when it reads them as here
    if read is not None:
        return read
    b = TenantBuilder(source, cfg, parse_iso_time, require_time=False)
    for run in runs:
        fh.seek(run.start)
        offset, lineno, sha = run.start, run.first_line, hashlib.sha256()
        while offset < run.end:
            line, size, feed = _read_line(fh)
            if not size:
                raise _changed(source, offset, run, "file ended early")
            sha.update(feed)
            if size > len(line):
                b.reject((ReasonCode.OVERSIZE_RECORD, f"line of {size} bytes, more than {MAX_RECORD_BYTES}"),
                         f"line {lineno}", line[:4096], {"tenant_id": raw_tenant(line)})
            else:
                _add_line(b, _no_bom(line, offset), lineno)
            offset += size
            lineno += 1
        if offset != run.end or sha.digest() != run.sha.digest():
            raise _changed(source, offset, run, "content differs")
    return b.result()


def iter_tenants(path: str | Path, cfg: IOConfig) -> Iterator[ReadResult]:
    runs = index_runs(path)
    with open_checked(path) as fh:
        for tenant_runs in runs.values():
            yield _tenant_result(fh, tenant_runs, str(path), cfg)


def iter_batches(path: str | Path, cfg: IOConfig, batch_bytes: int) -> Iterator[ReadResult]:
    """Whole tenants, several to a result: consecutive tenants (in file order) up to
    ``batch_bytes`` of records; a larger tenant alone. Each tenant's tables are what
    :func:`iter_tenants` gives for it."""
    runs = index_runs(path)
    with open_checked(path) as fh:
        group: list[_Run] = []
        size = 0
        for tenant_runs in runs.values():
            n = sum(r.end - r.start for r in tenant_runs)
            if group and size + n > batch_bytes:
                yield _tenant_result(fh, group, str(path), cfg)
                group, size = [], 0
            group += tenant_runs
            size += n
        if group:
            yield _tenant_result(fh, group, str(path), cfg)


def fingerprints(path: str | Path) -> dict[str, str]:
    out = {}
    for tenant, tenant_runs in index_runs(path).items():
        h = hashlib.sha256()
        for run in tenant_runs:
            h.update(run.sha.digest())
        out[tenant if tenant is not None else ""] = h.hexdigest()
    return out
