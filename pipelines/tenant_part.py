"""A tenant row's part of the version: the staged tables of the tenants one tenant operator row
built (:meth:`pipelines.tenant_op.TenantOp.build_one`), their graphs, their views and the Lance
rows the driver writes."""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from memlib import schema

log = logging.getLogger("memlib.build")

# a tenant's tables made by its tenant steps, before its graph: written while the graph is built
STEP_TABLES = ("turns", "segments", "edges", "questions", "node_fallbacks", "token_sums")


def _write_named(writer: Any, part: str, name: str, built: list[dict[str, Any]]) -> None:
    """Table ``name`` of the tenants in ``built`` (those that have rows of it) as one file of ``part``."""
    tables = [schema.conform(t[name], schema.TABLES[name], name=name) for t in built
              if t.get(name) is not None and t[name].num_rows]
    if tables:
        writer.write_table(name, part, pa.concat_tables(tables))


class PartAhead:
    """The part of a row that holds one tenant, its files written on a thread (``memlib-part``) as
    the tenant's tables are made: the tables of its tenant steps while its graph and Lance delta are
    computed, its staged Lance rows once compared, its turn view once its token matrix is referred
    to. :func:`write_part` writes the rest and waits for these (a failed write fails the row's part
    there, as a write of its own); :meth:`discard` removes them when the tenant fails."""

    def __init__(self, version_dir: str | Path, tenant: str):
        from memlib.io.store import StoreWriter, part_id

        self.version_dir = Path(version_dir)
        self.part = part_id([tenant], self.version_dir.name)
        self.writer = StoreWriter.into(self.version_dir)
        self.written: set[str] = set()  # tables, and the staged nodes and turn view by these names
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="memlib-part")
        self._pending: list[Future] = []
        self._files: list[Path] = []

    def _submit(self, what: str, write: Any, *args: Any) -> None:
        self.written.add(what)
        self._pending.append(self._pool.submit(write, *args))

    def tables(self, tables: dict[str, Any]) -> None:
        """Write the tenant's :data:`STEP_TABLES` (each its own file of the part)."""
        for name in STEP_TABLES:
            self._files.append(self.writer.table_path(name, self.part))
            self._submit(name, _write_named, self.writer, self.part, name, [tables])

    def staged_nodes(self, rows: pa.Table) -> None:
        """Write the tenant's Lance rows for the driver (:func:`_staged_nodes`)."""
        from pipelines.shard import staged_path

        self._files.append(staged_path(self.version_dir, "nodes", self.part))
        self._submit("lance_rows", _staged_nodes, self.version_dir, self.part, [rows])

    def turn_view(self, turns: pa.Table, matrix_ref: pa.Table | None) -> None:
        """Write the tenant's turn view (its token-matrix reference with it)."""
        from memlib.io.views import VIEW_TURNS, view_path

        self._files.append(view_path(self.version_dir, VIEW_TURNS, self.part))
        tenant = turns.column("tenant_id")[0].as_py() if turns.num_rows else ""
        self._submit(VIEW_TURNS, _turn_view, self.version_dir, self.part,
                     [tenant], [{"turns": turns, "matrix_refs": matrix_ref}])

    def wait(self) -> None:
        """Wait for every write started; raise the first one's error."""
        try:
            for f in self._pending:
                f.result()
        finally:
            self._pool.shutdown(wait=True)

    def close(self) -> None:
        """Wait for every write started (their errors were raised by :meth:`wait`, or do not matter)."""
        self._pool.shutdown(wait=True)

    def discard(self) -> None:
        """Wait for the writes started, then remove what they wrote (the tenant failed: nothing of it
        stays in the version)."""
        for f in self._pending:
            f.exception()
        self._pool.shutdown(wait=True)
        for p in self._files:
            p.unlink(missing_ok=True)


def _staged_nodes(version_dir: Path, part: str, built: list[dict[str, Any]] | list[pa.Table]) -> str:
    """The rows the driver writes to Lance: a tenant's changed rows, or all of them (lance_delta);
    read once by the driver, then removed: written plain (zstd was a third of the part's writing)."""
    from memlib.io.files import PLAIN, replace_parquet
    from pipelines.shard import staged_path

    nodes = pa.concat_tables([t if isinstance(t, pa.Table) else t["lance_rows"] for t in built],
                             promote_options="permissive")
    return str(replace_parquet(nodes, staged_path(version_dir, "nodes", part), **PLAIN))


def _turn_view(version_dir: Path, part: str, tenants: list[str], built: list[dict[str, Any]]) -> None:
    """The part's turn view, each tenant's token-matrix reference kept with its turns."""
    from memlib.io.views import VIEW_TURNS, view_path, write_view

    refs = {tenant: {"matrix_ref": {k: v for k, v in t["matrix_refs"].to_pylist()[0].items() if k != "tenant_id"}}
            for tenant, t in zip(tenants, built) if t.get("matrix_refs") is not None and t["matrix_refs"].num_rows}
    write_view(view_path(version_dir, VIEW_TURNS, part), VIEW_TURNS,
               {k: t["turns"] for k, t in zip(tenants, built)}, refs)


def write_part(version_dir: str | Path, built: list[dict[str, Any]], dim: int,
               ahead: PartAhead | None = None) -> tuple[str, str]:
    """Write the tables of the tenants of one row (each a dict of table -> Arrow table, see
    :meth:`TenantOp.build_one`) as one part of the version; returns the part's name and its
    staged nodes file. ``ahead``: the row's one tenant's files already being written."""
    from memlib.io.store import TENANT_TABLES, StoreWriter, part_id

    version_dir = Path(version_dir)
    writer = StoreWriter.into(version_dir)
    tenants = [next(iter(t["graphs"])) for t in built]
    part = part_id(tenants, version_dir.name)
    done = ahead.written if ahead is not None and ahead.part == part else set()

    def write_tables() -> None:
        for name in TENANT_TABLES:
            if name not in done:
                _write_named(writer, part, name, built)

    # its Parquet tables on another thread (Arrow encodes and compresses without the GIL) while this
    # one writes the graphs, the views and the staged Lance rows
    with ThreadPoolExecutor(1, thread_name_prefix="memlib-part") as pool:
        tables_written = pool.submit(write_tables)
        _write_views(version_dir, writer, part, built, dim, done)
        nodes_path = staged_path_of(version_dir, part) if "lance_rows" in done else \
            _staged_nodes(version_dir, part, built)
        tables_written.result()
    if ahead is not None:
        ahead.wait()
    return part, nodes_path


def staged_path_of(version_dir: Path, part: str) -> str:
    """The staged nodes file of ``part``."""
    from pipelines.shard import staged_path

    return str(staged_path(version_dir, "nodes", part))


def _write_views(version_dir: Path, writer: Any, part: str, built: list[dict[str, Any]], dim: int,
                 done: set[str]) -> None:
    """The graphs and the views of a part (:func:`write_part`), but those in ``done``."""
    from memlib.graph.memory_arrays import memory_table_from_nodes
    from memlib.io.memory_view import VIEW_MEMORY
    from memlib.io.views import VIEW_NODES, VIEW_TURNS, ordered, view_path, write_view

    tenants = [next(iter(t["graphs"])) for t in built]
    writer.write_graphs(part, {k: v for t in built for k, v in t["graphs"].items() if v is not None})
    # what a server maps to open a tenant; its token-matrix reference kept with its turns
    by_tenant = dict(zip(tenants, built))
    write_view(view_path(version_dir, VIEW_NODES, part), VIEW_NODES, {k: t["nodes"] for k, t in by_tenant.items()})
    if VIEW_TURNS not in done:
        _turn_view(version_dir, part, tenants, built)
    # what auto's memory signals read: fact and event vectors, their citations, the graph's arrays
    # (without it, a part's tenants read Lance and the graph file: docs/decisions/0036-memory-view.md)
    try:
        # each from its graph in memory (its bytes loaded back were the same arrays, 0.17 s later)
        memory = {k: memory_table_from_nodes(t["nodes"], ordered(VIEW_TURNS, t["turns"]),
                                             (t.get("memory_graphs") or {}).get(k, t["graphs"].get(k)), dim)
                  for k, t in by_tenant.items()}
        write_view(view_path(version_dir, VIEW_MEMORY, part), VIEW_MEMORY, {k: m[0] for k, m in memory.items()},
                   {k: m[1] for k, m in memory.items()})
    except Exception as exc:  # noqa: BLE001 - an optimization never fails a part
        log.warning("part %s: no memory view (%s: %s)", part, type(exc).__name__, str(exc)[:160])
