"""The JSONL reader's columnar path: a batch's turn records decoded by Arrow, checked by column.

:func:`memlib.io.generic.iter_batches` reads a batch of tenants record by record (each line decoded
by ``json``, each turn checked and kept field by field: ~1 s of a 27k-turn tenant, all of it holding
the GIL while the driver loads its models beside it). Arrow's JSON reader decodes the same lines
into columns without the GIL; :func:`read_columnar` then checks the turns column by column and
builds the TURNS table the record path builds. It answers only for input whose every turn the
record path would keep as it stands: a batch with a line that is blank, behind a BOM, not one JSON
object, nested more than :data:`~memlib.io.scan.MAX_DEPTH` deep, holding an integer Python would
refuse, a value that is not a string where a string is read, a lone surrogate or invalid UTF-8, or
a turn that any check of :class:`~memlib.io.builder.TenantBuilder` refuses or changes (a role
spelled otherwise, extras, a duplicate turn id, a blank id or text, an unparseable time) gets
``None``, and is read record by record. Records of other kinds (questions) are always read by the
record path, in file order, by the builder that then takes these turns.
"""
from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from memlib import ids, schema
from memlib.io.builder import ROLES, TenantBuilder, micros
from memlib.io.jsonarray import UTF8_BOM
from memlib.io.scan import too_deep
from memlib.io.validate import is_id, parse_iso_time, validate_tenant_id

TURN_FIELDS = ("tenant_id", "conversation_id", "session_id", "session_time", "turn_id", "speaker", "role", "text")
_READ = pa.schema([(name, pa.string()) for name in (*TURN_FIELDS, "kind", "extras")])
_PRINTABLE = "[!-~]"  # an ASCII character str.strip() keeps: a value holding one is not blank


def read_columnar(fh, runs: list, source: str, cfg: Any, add_line: Callable[[TenantBuilder, bytes, int], None]) -> Any:
    """The :class:`~memlib.io.result.ReadResult` of ``runs`` (byte ranges of whole lines, with the
    hash the first pass took of each) as the record path gives it (``add_line`` reads a record of
    another kind into the builder, with its line number), or None when only the record
    path can read them (see the module's docstring). A run whose bytes differ from the hash is
    None too: the record path then reports the file changed."""
    chunks, first_lines = [], []
    for run in runs:
        fh.seek(run.start)
        data = fh.read(run.end - run.start)
        if len(data) != run.end - run.start or hashlib.sha256(data).digest() != run.sha.digest():
            return None
        if run.start == 0 and data.startswith(UTF8_BOM):
            return None
        chunks.append(data)
        first_lines.append(run.first_line)
    if any(not c.endswith(b"\n") for c in chunks[:-1]):
        return None
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    ends = _line_ends(data)
    if not ends or not _plain_lines(data, ends):
        return None
    table = _decoded(data, len(ends))
    if table is None:
        return None
    kind = table.column("kind")
    is_turn = pc.or_(pc.is_null(kind), pc.is_in(kind, pa.array(["", "turn"])))  # the builder's kind or "turn"
    turns = table.filter(is_turn) if pc.any(pc.invert(is_turn)).as_py() else table
    columns = _checked(turns, cfg)
    if columns is None:
        return None
    b = TenantBuilder(source, cfg, parse_iso_time, require_time=False)
    if turns.num_rows != table.num_rows:  # the other records, read by the builder in file order
        numbers = _line_numbers(ends, [len(c) for c in chunks], first_lines)
        for i in np.flatnonzero(~is_turn.to_numpy(zero_copy_only=False)):
            start = ends[i - 1] + 1 if i else 0
            add_line(b, data[start:ends[i] + 1], int(numbers[i]))  # with its newline, as the record path reads it
    return b.result_with(turn_table(columns))


def _line_numbers(ends: list[int], sizes: list[int], first_lines: list[int]) -> np.ndarray:
    """Each line's number in its file: the run it is in (runs of ``sizes`` bytes, one after the
    other) starts at line ``first_lines[i]``."""
    bounds = np.cumsum(sizes)
    run = np.searchsorted(bounds, np.asarray(ends), side="right").clip(max=len(sizes) - 1)
    first_of_run = np.searchsorted(np.asarray(ends), np.r_[0, bounds[:-1]])  # index of each run's first line
    return np.asarray(first_lines)[run] + np.arange(len(ends)) - first_of_run[run]


def _line_ends(data: bytes) -> list[int]:
    """Where each line of ``data`` ends (its newline, or the end of the data for a last line without
    one): positions, not a copy of each line."""
    ends, find, at = [], data.find, -1
    while (at := find(b"\n", at + 1)) >= 0:
        ends.append(at)
    if data and not data.endswith(b"\n"):
        ends.append(len(data))
    return ends


def _plain_lines(data: bytes, ends: list[int]) -> bool:
    """Every line one JSON object (it opens with ``{``), valid UTF-8 (Arrow's reader does not check
    the bytes of fields it skips), nested no deeper than the record path reads, and holding no
    integer longer than Python converts (both decided by the record path's own tests)."""
    starts = [0, *(e + 1 for e in ends[:-1])]
    if any(data[s] != 0x7B for s in starts) or not _utf8(data):  # 0x7B: "{"
        return False
    find = data.find
    if any((find(b"[", s, e) >= 0 or find(b"{", s + 1, e) >= 0) and too_deep(data[s:e]) for s, e in zip(starts, ends)):
        return False
    limit = sys.get_int_max_str_digits()
    if limit:
        digits = re.compile(rb"[0-9]{%d}" % limit)
        if any(e - s > limit and digits.search(data, s, e) for s, e in zip(starts, ends)):
            return False
    return True


def _utf8(data: bytes) -> bool:
    if data.isascii():
        return True
    try:
        pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(np.array([0, len(data)], np.int32)),
                                               pa.py_buffer(data)]).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _decoded(data: bytes, n_lines: int) -> pa.Table | None:
    """The lines' fields read by Arrow, one row per line; None when Arrow refuses a line (for one, a
    value of another type, a key given twice, a lone surrogate or a control character in a string)
    or reads another number of rows than there are lines (two objects on one line)."""
    try:
        table = pj.read_json(pa.BufferReader(data),
                             read_options=pj.ReadOptions(use_threads=False, block_size=max(len(data), 1 << 20)),
                             parse_options=pj.ParseOptions(explicit_schema=_READ, unexpected_field_behavior="ignore"))
    except pa.ArrowException:  # any refusal: the record path reads these lines
        return None
    return table if table.num_rows == n_lines else None


def _not_blank(col: pa.ChunkedArray) -> bool:
    """No null and no value ``is_id`` refuses (the values without a printable ASCII character are
    asked one by one)."""
    if col.null_count:
        return False
    sure = pc.match_substring_regex(col, _PRINTABLE)
    if pc.all(sure).as_py():
        return True
    return all(is_id(v) for v in col.filter(pc.invert(sure)).to_pylist())


def _checked(turns: pa.Table, cfg: Any) -> dict[str, Any] | None:
    """The turn columns the builder would keep (role and time as it stores them), or None when a
    turn would be refused or changed."""
    if not turns.num_rows or turns.column("extras").null_count != turns.num_rows:
        return None
    tenant = turns.column("tenant_id")
    if tenant.null_count or any(validate_tenant_id(t) for t in pc.unique(tenant).to_pylist()):
        return None
    if not all(_not_blank(turns.column(c)) for c in ("conversation_id", "session_id", "turn_id", "text")):
        return None
    text = turns.column("text")
    if pc.max(pc.utf8_length(text)).as_py() > cfg.max_turn_chars:
        return None
    role = turns.column("role")
    if role.null_count or not pc.all(pc.is_in(role, pa.array(sorted(ROLES)))).as_py():
        return None
    if len(np.unique(_codes(turns, ["tenant_id", "conversation_id", "turn_id"]))) != turns.num_rows:
        return None  # a turn id used twice in a conversation
    times = _times(turns.column("session_time"))
    if times is None:
        return None
    return {**{c: turns.column(c) for c in TURN_FIELDS}, "session_time": times}


def _codes(table: pa.Table, names: list[str]) -> np.ndarray:
    """One int64 per row, equal for two rows exactly when their values of ``names`` are equal."""
    code = np.zeros(table.num_rows, np.int64)
    for name in names:
        enc = pc.dictionary_encode(_one_chunk(table.column(name)))
        _, code = np.unique(code * len(enc.dictionary) + enc.indices.to_numpy(), return_inverse=True)
    return code


def _times(col: pa.ChunkedArray) -> np.ndarray | None:
    """Microseconds of each turn's session_time as the builder stores them (int64, with -1 for none
    and a mask), from each distinct text parsed once; None when a text does not parse."""
    values = pc.unique(col).to_pylist()
    parsed = {}
    for v in values:
        if v is None or v == "":
            continue
        parsed[v] = micros(parse_iso_time(v))
        if parsed[v] is None:
            return None
    if not parsed:
        return np.ma.masked_all(len(col), np.int64)
    given = pa.array(list(parsed), pa.string())
    at = pc.index_in(col, value_set=given).to_numpy(zero_copy_only=False)
    lookup = np.array(list(parsed.values()), np.int64)
    missing = np.isnan(at) if at.dtype.kind == "f" else np.zeros(len(at), bool)
    index = np.where(missing, 0, at).astype(np.int64)
    return np.ma.array(lookup[index], mask=missing)


def turn_table(cols: dict[str, Any]) -> pa.Table:
    """The TURNS table of kept turns given by column (in record order), as
    :meth:`TenantBuilder.turn_table` builds it from lists: sessions ordered within their
    conversation by their first dated turn's time (undated last), then by their first record; turns
    by record order within their session; every turn takes its session's first time."""
    n = len(cols["text"])
    codes, ranks = [], []
    for name in ("tenant_id", "conversation_id", "session_id"):
        enc = pc.dictionary_encode(_one_chunk(cols[name]))
        codes.append(enc.indices.to_numpy().astype(np.int64))
        ranks.append(np.argsort(pc.array_sort_indices(enc.dictionary).to_numpy()))
    t, c, s = codes
    _, conv_code = np.unique(t * (c.max() + 1) + c, return_inverse=True)  # (tenant, conversation) -> a code < n
    _, first, inv = np.unique(conv_code * (s.max() + 1) + s, return_index=True, return_inverse=True)
    n_sessions = len(first)
    times = cols["session_time"]
    dated = np.flatnonzero(~np.ma.getmaskarray(times))
    first_time = np.zeros(n_sessions, np.int64)
    has_time = np.zeros(n_sessions, bool)
    if len(dated):
        groups, at = np.unique(inv[dated], return_index=True)
        first_time[groups] = np.ma.getdata(times)[dated[at]]
        has_time[groups] = True
    conv_of = conv_code[first]
    order = np.lexsort((first, first_time, ~has_time, ranks[1][c[first]], ranks[0][t[first]]))
    position = np.empty(n_sessions, np.int64)
    position[order] = np.arange(n_sessions)
    taken = np.argsort(position[inv], kind="stable")
    sizes = np.bincount(inv, minlength=n_sessions)[order]
    starts = np.cumsum(sizes) - sizes
    turn_index = np.arange(n) - np.repeat(starts, sizes)
    conv_sorted = conv_of[order]
    new_conv = np.r_[True, conv_sorted[1:] != conv_sorted[:-1]]
    group_start = np.maximum.accumulate(np.where(new_conv, np.arange(n_sessions), 0))
    session_index = np.repeat(np.arange(n_sessions) - group_start + 1, sizes)
    time_of = np.repeat(first_time[order], sizes)
    time_given = np.repeat(has_time[order], sizes)
    in_order = bool((taken == np.arange(n)).all())
    out = {name: (col if in_order else col.take(pa.array(taken))) for name, col in cols.items()
           if name != "session_time"}
    tenants, convs, turn_ids = (out[k].to_pylist() for k in ("tenant_id", "conversation_id", "turn_id"))
    arrays = {
        **out,
        "session_index": pa.array(session_index, pa.int32()),
        "session_time": pa.array(time_of, pa.int64(), mask=~time_given).cast(schema.TS),
        "turn_index": pa.array(turn_index, pa.int32()),
        "node_id": pa.array(ids.turn_node_ids(tenants, convs, turn_ids), pa.string()),
        "content_hash": pa.array(_content_hashes(_one_chunk(out["text"])), pa.string()),
        "extras": pa.nulls(n, pa.string()),
    }
    table = pa.Table.from_arrays([_one_chunk(arrays[f.name]) for f in schema.TURNS], schema=schema.TURNS)
    return schema.conform(table, schema.TURNS, name="turns")


def _content_hashes(text: pa.Array) -> list[str]:
    """``ids.content_hashes`` of a string column, hashed from its buffer (no str, no bytes object per
    value: 30 MB of fresh memory for a 27k-turn tenant)."""
    offsets = np.frombuffer(text.buffers()[1], np.int32)[text.offset:text.offset + len(text) + 1].tolist()
    values = memoryview(text.buffers()[2] or b"")
    if _holds_escaped(values, offsets[0], offsets[-1]):
        plain = pc.invert(pc.match_substring_regex(text, "[\\x00\\x1b\\x1e\\x1f]")).to_pylist()
    else:
        plain = [True] * len(text)
    return ids.content_hashes_utf8((values[a:b] for a, b in zip(offsets, offsets[1:])), plain)


_ESCAPED = np.array([0x00, 0x1B, 0x1E, 0x1F], np.uint8)  # the bytes ids.escape escapes


def _holds_escaped(values: memoryview, start: int, end: int, step: int = 1 << 16) -> bool:
    """Whether ``values[start:end]`` holds a byte ``ids.escape`` escapes, 64 kB at a time: temporaries
    below the allocator's mmap threshold reuse its pages (one the column's size, or of a megabyte,
    took fresh pages, each a fault on this VM)."""
    data = np.frombuffer(values, np.uint8)
    return any(np.isin(data[at:min(at + step, end)], _ESCAPED).any() for at in range(start, end, step))


def _one_chunk(col: Any) -> pa.Array:
    if not isinstance(col, pa.ChunkedArray):
        return col
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
