"""Checksums of the store's Lance data: each tenant's rows by content, the index and manifest files
of each published Lance version by their bytes (docs/decisions/0031-kept-file-checksums.md).

Lance itself reads a data file with bytes flipped in place without an error: a tenant's rows come
back with another vector or text, and its searches rank by them. So a tenant's Lance rows carry a
content checksum, ``[rows, crc32]`` per table, computed by the build from the rows it writes and
kept in the tenant's manifest entry (``lance_digest``). It is a checksum of the rows, not of the
files: compaction, index merges and other tenants' writes move rows between files and leave it
valid, and a damaged row copied by a compaction into a new file still fails it. The index files
and the version manifest of each published Lance version are immutable files; their
``[size, crc32, mtime_ns]`` is kept in the manifest (``lance_files``, by path under ``lance/``),
and so is that of every data and deletion file (``lance_data``): a nightly hashes again only a
data file written since, and reads the rows of the tenants it carries only when one is damaged.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.io.checksums import carried_entry, crc_of
from memlib.io.take import BLOCK_ROWS, VectorRows, take_column

LANCE_DIGEST_KEY = "lance_digest"  # tenant entry (and build summary): table -> [rows, crc32]
LANCE_FILES_KEY = "lance_files"  # manifest: index and manifest file (path under lance/) -> [size, crc32, mtime_ns]
LANCE_DATA_KEY = "lance_data"  # manifest: data and deletion file (path under lance/) -> [size, crc32, mtime_ns]
TURN_TEXT_COLUMNS = ("node_id", "tenant_id", "text")
_NO_VERSION = 2 ** 64 - 1  # Lance's v2 manifest names: u64::MAX - version


def row_columns(table: pa.Table, name: str) -> list[str]:
    """The columns a table's rows are checked on: a nodes row but its importance (kept apart, in
    ``node_importance``), a turn-text row whole."""
    if name == "turn_text":
        return list(TURN_TEXT_COLUMNS)
    return [f.name for f in schema.NODES if f.name != "importance" and f.name in table.column_names]


def _bytes(col: pa.Array) -> Iterator[Any]:
    """A canonical byte form of ``col`` (buffers, not copied where they can be): its validity, then
    its valid values (types of one kind, string or large string, list or large list, give the same
    bytes)."""
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    yield np.packbits(valid)
    t = col.type
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        if not pa.types.is_fixed_size_list(t):
            yield pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        values = col.flatten() if col.null_count == 0 else col.filter(pa.array(valid)).flatten()
        yield from _bytes(values)
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
        filled = pc.cast(col.fill_null("") if col.null_count else col, pa.large_binary())
        offsets = np.frombuffer(filled.buffers()[1], np.int64)[filled.offset:filled.offset + len(filled) + 1]
        yield np.diff(offsets)
        if len(filled):
            yield memoryview(filled.buffers()[2])[int(offsets[0]):int(offsets[-1])]
    elif pa.types.is_timestamp(t) or pa.types.is_date(t):
        yield np.ascontiguousarray(pc.cast(col, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), np.int64)
    elif pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_boolean(t):
        yield np.ascontiguousarray((col.fill_null(0) if col.null_count else col).to_numpy(zero_copy_only=False))
    else:  # not in the schemas: by value
        yield repr(col.to_pylist()).encode("utf-8")


def _vector_rows(col: pa.Array) -> np.ndarray | None:
    """A fixed-size list column of numbers without nulls at either level as a (rows, size) numpy
    view; None for any other column."""
    if not pa.types.is_fixed_size_list(col.type) or col.null_count or col.values.null_count:
        return None
    values = col.values
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        return None
    dim = col.type.list_size
    flat = values.slice(col.offset * dim, len(col) * dim).to_numpy(zero_copy_only=True)
    return flat.reshape(len(col), dim)


def _ones_bits(n: int) -> bytes:
    """``np.packbits(np.ones(n, bool))`` without the n booleans (a tenant's vector values: 41 MB)."""
    return b"\xff" * (n // 8) + (bytes([(0xFF << (8 - n % 8)) & 0xFF]) if n % 8 else b"")


def _sorted_bytes(col: pa.ChunkedArray, order: np.ndarray) -> Iterator[Any]:
    """:func:`_bytes` of ``col`` taken in ``order``: a float32 vector column without nulls read where
    it lies, chunk by chunk, :data:`BLOCK_ROWS` rows at a time (the same bytes as its sorted copy,
    which for a tenant's embeddings is most of its Lance bytes; no chunk is combined)."""
    view = VectorRows.of(col) if pa.types.is_fixed_size_list(col.type) and col.null_count == 0 else None
    if view is not None:
        yield _ones_bits(len(col))
        yield _ones_bits(len(col) * view.dim)
        block = np.empty((min(BLOCK_ROWS, order.size), view.dim), np.uint32)  # one block's rows, reused
        for s in range(0, order.size, BLOCK_ROWS):
            yield view.rows(order[s:s + BLOCK_ROWS], block)  # hashed before the next block overwrites it
        return
    arr = col.combine_chunks()
    rows = _vector_rows(arr)
    if rows is None:
        yield from _bytes(take_column(arr, order))
        return
    yield _ones_bits(len(arr))
    yield _ones_bits(rows.size)
    yield from (rows[i] for i in order.tolist())


def rows_digest(table: pa.Table, name: str) -> list[int]:
    """``[rows, crc32]`` of a tenant's rows of Lance table ``name`` (``nodes`` or ``turn_text``),
    whatever their order and chunking: the crc32 of each column's :func:`_bytes` with the rows
    sorted by node id."""
    cols = row_columns(table, name)
    order = pc.sort_indices(table.column("node_id")).to_numpy().astype(np.int64) if table.num_rows else None
    crc = 0
    for c in cols:
        crc = zlib.crc32(c.encode("utf-8"), crc)
        if order is not None:
            for part in _sorted_bytes(table.column(c), order):
                crc = zlib.crc32(part, crc)
    return [table.num_rows, crc]


def tenant_digest(nodes: pa.Table) -> dict[str, list[int]]:
    """The ``lance_digest`` of a tenant whose nodes are ``nodes``: what the build writes to both
    Lance tables for it (memlib/io/lance_tables.py ``write_tenants``)."""
    # only the turn-text columns are filtered: a filter of every column copies the turns' vectors
    # (26,738 x 384 float32 = 41 MB of fresh pages for the 2,500-session tenant) to hash none of them
    turns = nodes.select(list(TURN_TEXT_COLUMNS)).filter(pc.equal(nodes.column("kind"), "turn"))
    return {"nodes": rows_digest(nodes, "nodes"), "turn_text": rows_digest(turns, "turn_text")}


def manifest_file(table_dir: Path, version: int) -> Path:
    """The manifest file of Lance version ``version`` of the table at ``table_dir`` (either naming)."""
    v2 = table_dir / "_versions" / f"{_NO_VERSION - int(version)}.manifest"
    return v2 if v2.exists() else table_dir / "_versions" / f"{int(version)}.manifest"


def version_files(tbl: Any, table_dir: Path) -> list[Path]:
    """The immutable files outside the data files that Lance version ``tbl.version`` of a table reads:
    its manifest and each of its indexes' files."""
    out = [manifest_file(table_dir, tbl.version)]
    for index in tbl.list_indices():
        uuid = getattr(index, "index_uuid", None)
        if uuid:
            out += sorted(p for p in (table_dir / "_indices" / str(uuid)).rglob("*") if p.is_file())
    return out


def data_files(table_dir: Path) -> list[Path]:
    """Every data and deletion file of a Lance table, of any of its versions (Lance never rewrites
    one in place; compaction writes new ones)."""
    return sorted(p for sub in ("data", "_deletions") for p in (table_dir / sub).glob("*") if p.is_file())


def files_crcs(lance_dir: Path, files: list[Path], known: dict[str, list[int]] | None) -> dict[str, list[int]]:
    """``[size, crc32, mtime_ns]`` of ``files`` by path under ``lance_dir``; a file ``known`` lists
    with its size keeps its entry, not hashed again (Lance never rewrites a file in place)."""
    out = {}
    for f in files:
        rel = f.relative_to(lance_dir).as_posix()
        old = (known or {}).get(rel)
        if old is not None and f.stat().st_size == int(old[0]):
            out[rel] = carried_entry(f, f, list(old))
        else:
            mtime = f.stat().st_mtime_ns
            out[rel] = [*crc_of(f), mtime]
    return out
