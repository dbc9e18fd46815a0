"""Tenant views: what a server opens for a tenant, written by the build beside its part's tables
in a layout that opens by mapping, without decoding (docs/decisions/0028-tenant-views.md).

A part's view files::

    versions/vN/view_nodes/<part>.arrow   the part's nodes without their embedding (VIEW_NODE_COLUMNS)
    versions/vN/view_turns/<part>.arrow   the part's turns in conversation order (VIEW_TURN_COLUMNS)

Each is an uncompressed Arrow IPC file holding one record batch per tenant, the tenants named in
order in the schema's metadata: opening a tenant maps the file and takes its batch, zero-copy
(the pages are the file's). Like the part's Parquet tables, a file may hold dead tenants' batches
(rebuilt or removed since it was written); the manifest says which are live.

A view is a copy of rows the store holds elsewhere (the Lance ``nodes`` table, the ``turns``
Parquet part), so it is never trusted blindly: a reader checks the batch's row count against the
manifest's count of the tenant, and a missing, unreadable or disagreeing view makes the caller
read the tables themselves (:class:`memlib.retrieve.tenant.TenantIndex`).
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memlib import schema
from memlib.io.files import atomic_write, of_tenants, safe_name

VIEW_NODES = "view_nodes"
VIEW_TURNS = "view_turns"
VIEW_MEMORY = "view_memory"  # a part's memory view (memlib/io/memory_view.py: its own columns)
VIEW_TABLES = (VIEW_NODES, VIEW_TURNS)
ALL_VIEWS = (*VIEW_TABLES, VIEW_MEMORY)  # what a carried part links, with its memory view (memlib/io/memory_view.py)
VIEW_SUFFIX = ".arrow"
VIEW_FORMAT = "1"
TENANTS_KEY = b"memlib.tenants"
FORMAT_KEY = b"memlib.view_format"
META_KEY = "memlib.tenant"  # a batch's custom metadata: the tenant's JSON object (write_view's meta)
VIEW_NODE_COLUMNS = ["node_id", "kind", "text", "time", "session_id", "provenance", "attributes", "importance"]
VIEW_TURN_COLUMNS = ["node_id", "turn_id", "session_id", "session_index", "session_time", "turn_index",
                     "speaker", "role", "text"]
COLUMNS = {VIEW_NODES: VIEW_NODE_COLUMNS, VIEW_TURNS: VIEW_TURN_COLUMNS}
OPEN_FILES = 256  # mapped view files a process keeps open (a file descriptor each)


class ViewError(ValueError):
    """A view file that cannot be trusted (the caller reads the store's tables instead)."""


def view_path(version_dir: Path, name: str, part: str) -> Path:
    return Path(version_dir) / name / f"{safe_name(part)}{VIEW_SUFFIX}"


def ordered(name: str, table: pa.Table) -> pa.Table:
    """``table``'s columns of view ``name``, its rows in the view's order (turns: conversation order)."""
    table = table.select(COLUMNS[name]) if name in COLUMNS else table
    if name == VIEW_TURNS and table.num_rows:
        table = table.sort_by([("session_index", "ascending"), ("turn_index", "ascending")])
    return table


def write_view(path: Path, name: str, tables: Mapping[str, pa.Table],
               meta: Mapping[str, Mapping[str, Any]] | None = None) -> Path:
    """Write view ``name`` of a part: ``tables`` maps each tenant to its rows (any column order,
    extra columns dropped; turns are put in conversation order); ``meta``: per tenant, a JSON
    object kept with its batch (:meth:`ViewFiles.meta`; the turns view holds the tenant's
    ``auto`` token-matrix reference there)."""
    tenants = list(tables)
    if not tenants:
        return path
    tables_ = [ordered(name, tables[t]) for t in tenants]
    base = tables_[0].schema
    batches = []
    for t, table in zip(tenants, tables_):
        try:
            table = table.cast(base) if not table.schema.equals(base) else table
        except (pa.ArrowException, ValueError) as exc:
            raise ViewError(f"view {name}: rows of tenant {t!r} do not fit the part's columns ({exc})") from None
        rb = table.combine_chunks().to_batches()
        batches.append(rb[0] if rb else pa.record_batch([pa.array([], f.type) for f in base], schema=base))
    sch = base.with_metadata({TENANTS_KEY: json.dumps(tenants).encode("utf-8"), FORMAT_KEY: VIEW_FORMAT.encode()})

    meta = meta or {}

    def write(fh: BinaryIO) -> None:
        with pa.ipc.new_file(fh, sch) as writer:
            for t, b in zip(tenants, batches):
                extra = meta.get(t)
                writer.write_batch(b, custom_metadata={META_KEY: json.dumps(extra)} if extra else None)

    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, write)


def split_by_tenant(table: pa.Table, tenants: Iterable[str]) -> dict[str, pa.Table]:
    """``tenants`` -> their rows of ``table`` (which has a ``tenant_id`` column)."""
    col = table.column("tenant_id")
    return {t: table.filter(pc.equal(col, t)) for t in tenants}


class _Mapped:
    """One mapped view file: its tenants' batch numbers and the open IPC reader."""

    def __init__(self, path: Path):
        self.signature = _signature(path)
        try:
            self.reader = pa.ipc.open_file(pa.memory_map(str(path)))
            meta = self.reader.schema.metadata or {}
            if meta.get(FORMAT_KEY) != VIEW_FORMAT.encode():
                raise ViewError(f"{path}: not a memlib view file of format {VIEW_FORMAT}")
            names = json.loads(meta[TENANTS_KEY].decode("utf-8"))
        except (OSError, KeyError, ValueError, pa.ArrowException) as exc:
            raise ViewError(f"{path}: unreadable view file ({str(exc)[:160]})") from None
        if not isinstance(names, list) or len(names) != self.reader.num_record_batches:
            raise ViewError(f"{path}: names {len(names) if isinstance(names, list) else '?'} tenants for "
                            f"{self.reader.num_record_batches} batches")
        self.batch_of = {t: i for i, t in enumerate(names)}


def _signature(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, st.st_size


class ViewFiles:
    """Mapped view files of a process, least recently used closed first (:data:`OPEN_FILES`).
    Thread-safe. A file replaced on disk (another inode, size or time) is mapped again."""

    def __init__(self, max_open: int = OPEN_FILES):
        self.max_open = max_open
        self._open: OrderedDict[str, _Mapped] = OrderedDict()
        self._lock = threading.Lock()

    def tenant(self, path: Path, tenant: str, rows: int | None = None) -> pa.RecordBatch:
        """``tenant``'s batch of the view file at ``path`` (views of the mapped pages). Raises
        :class:`ViewError` when the file is missing or unreadable, does not hold the tenant, or
        (``rows`` given) holds another number of rows for it."""
        mapped, i = self._find(path, tenant)
        try:
            batch = mapped.reader.get_batch(i)
        except (OSError, pa.ArrowException) as exc:
            raise ViewError(f"{path}: batch of {tenant!r} unreadable ({str(exc)[:160]})") from None
        if rows is not None and batch.num_rows != rows:
            raise ViewError(f"{path}: {batch.num_rows} rows for tenant {tenant!r}, the manifest counts {rows}")
        return batch

    def meta(self, path: Path, tenant: str) -> dict[str, Any]:
        """The JSON object kept with ``tenant``'s batch (empty when none); :class:`ViewError` as
        :meth:`tenant`, or when it is not a JSON object."""
        mapped, i = self._find(path, tenant)
        try:
            _, custom = mapped.reader.get_batch_with_custom_metadata(i)
            raw = (custom or {}).get(META_KEY.encode())
            value = json.loads(raw.decode("utf-8")) if raw else {}
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise ViewError(f"{path}: metadata of {tenant!r} unreadable ({str(exc)[:160]})") from None
        if not isinstance(value, dict):
            raise ViewError(f"{path}: metadata of {tenant!r} is not a JSON object")
        return value

    def _find(self, path: Path, tenant: str) -> tuple["_Mapped", int]:
        key = str(path)
        try:
            sig = _signature(path)
        except OSError:
            raise ViewError(f"{path}: no view file") from None
        with self._lock:
            mapped = self._open.get(key)
            if mapped is not None and mapped.signature == sig:
                self._open.move_to_end(key)
            else:
                mapped = None
        if mapped is None:
            mapped = _Mapped(path)
            with self._lock:
                self._open[key] = mapped
                while len(self._open) > self.max_open:
                    self._open.popitem(last=False)
        i = mapped.batch_of.get(tenant)
        if i is None:
            raise ViewError(f"{path}: holds no view of tenant {tenant!r}")
        return mapped, i


VIEWS = ViewFiles()  # the process's mapped view files


def read_batches(path: Path) -> dict[str, tuple[pa.RecordBatch, dict[str, Any]]]:
    """Every tenant's batch of a view file and its metadata (a part being rewritten)."""
    mapped = _Mapped(path)
    out = {}
    for t, i in mapped.batch_of.items():
        batch, custom = mapped.reader.get_batch_with_custom_metadata(i)
        raw = (custom or {}).get(META_KEY.encode())
        out[t] = (batch, json.loads(raw.decode("utf-8")) if raw else {})
    return out


def views_from_tables(reader, version_dir: Path, parts: Mapping[str, list[str]]) -> int:
    """Write the views of ``parts`` (part -> its live tenants) into ``version_dir`` from the tables
    of ``reader``'s version (its pinned Lance nodes, its ``turns`` parts): a store written before
    views gets them as a build carries its parts over. Returns the number of view files written."""
    tenants = sorted({t for ts in parts.values() for t in ts})
    if not tenants:
        return 0
    nodes = reader.nodes(None, columns=["tenant_id", *VIEW_NODE_COLUMNS])
    nodes = nodes.filter(pc.is_in(nodes.column("tenant_id"), value_set=pa.array(tenants, pa.string())))
    by_tenant = _groups(nodes)
    written = 0
    for part, members in sorted(parts.items()):
        files = sorted({reader.table_file("turns", t) for t in members})
        turns = [of_tenants(pq.read_table(f), members) for f in files if f.exists()]
        turns = pa.concat_tables(turns, promote_options="permissive") if turns else schema.TURNS.empty_table()
        turn_groups = _groups(turns)
        write_view(view_path(version_dir, VIEW_NODES, part), VIEW_NODES,
                   {t: by_tenant.get(t, nodes.schema.empty_table()) for t in members})
        refs: dict[str, dict[str, Any]] = {}
        for f in sorted({reader.table_file("matrix_refs", t) for t in members}):
            if f.exists():
                for row in of_tenants(pq.read_table(f), members).to_pylist():
                    refs[row.pop("tenant_id")] = {"matrix_ref": row}
        write_view(view_path(version_dir, VIEW_TURNS, part), VIEW_TURNS,
                   {t: turn_groups.get(t, turns.schema.empty_table()) for t in members}, refs)
        written += 2
    return written


def _groups(table: pa.Table) -> dict[str, pa.Table]:
    """Rows of ``table`` by tenant, each tenant's rows in their order in ``table``."""
    if table.num_rows == 0:
        return {}
    order = pc.sort_indices(table, sort_keys=[("tenant_id", "ascending")])  # stable
    table = table.take(order)
    values = table.column("tenant_id").to_pylist()
    cuts = [0] + [i for i in range(1, len(values)) if values[i] != values[i - 1]] + [len(values)]
    return {values[a]: table.slice(a, b - a) for a, b in zip(cuts, cuts[1:])}
