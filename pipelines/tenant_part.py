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


# a tenant's tables that its graph does not change, largest first: :class:`EarlyPart` writes them
# while the graph is built
EARLY_TABLES = ("node_fallbacks", "token_sums", "edges", "turns", "segments")


class EarlyPart:
    """The part of a row of one tenant, started before the tenant's graph: its tables that do not
    depend on the graph (:data:`EARLY_TABLES`) and its staged Lance rows are written on another
    thread as soon as they are made, while the graph and importance are computed. :func:`write_part`
    then writes only the rest. A tenant that fails leaves files of a part no tenant is in: the
    version's writer removes them (:meth:`memlib.io.parts.PartsCarrier.prune_parts`)."""

    def __init__(self, version_dir: str | Path, tenant: str):
        from memlib.io.store import StoreWriter, part_id

        self.version_dir = Path(version_dir)
        self.tenant = tenant
        self.part = part_id([tenant], self.version_dir.name)
        self.writer = StoreWriter.into(self.version_dir)
        self.written: set[str] = set()
        self._jobs: list[Future] = []
        self._nodes: Future | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="memlib-part")

    def tables(self, tables: dict[str, pa.Table | None]) -> None:
        """Start writing the tenant's tables of :data:`EARLY_TABLES` in ``tables``."""
        for name in EARLY_TABLES:
            table = tables.get(name)
            self.written.add(name)  # an empty or absent table is not written (write_part's rule)
            if table is not None and table.num_rows:
                self._jobs.append(self._pool.submit(self.writer.write_table, name, self.part, table))

    def lance_rows(self, rows: pa.Table) -> None:
        """Start writing the tenant's staged Lance rows (see :func:`_write_views`)."""
        self._nodes = self._pool.submit(_write_staged, self.version_dir, self.part, [rows])

    def nodes_path(self) -> str | None:
        """The staged Lance rows' file, once written (None: not started here)."""
        return self._nodes.result() if self._nodes is not None else None

    def wait(self) -> None:
        """Wait for the tables started; raises what their writes raised."""
        for job in self._jobs:
            job.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def write_part(version_dir: str | Path, built: list[dict[str, Any]], dim: int,
               early: EarlyPart | None = None) -> tuple[str, str]:
    """Write the tables of the tenants of one row (each a dict of table -> Arrow table, see
    :meth:`TenantOp.build_one`) as one part of the version; returns the part's name and its
    staged nodes file. ``early``: the row's one tenant's part, partly written already."""
    from memlib.io.store import TENANT_TABLES, StoreWriter, part_id

    version_dir = Path(version_dir)
    writer = StoreWriter.into(version_dir)
    tenants = [next(iter(t["graphs"])) for t in built]
    if early is not None and tenants != [early.tenant]:
        early = None
    part = early.part if early is not None else part_id(tenants, version_dir.name)
    done = early.written if early is not None else set()

    def write_tables() -> None:
        for name in (n for n in TENANT_TABLES if n not in done):
            tables = [schema.conform(t[name], schema.TABLES[name], name=name) for t in built
                      if t.get(name) is not None and t[name].num_rows]
            if tables:
                writer.write_table(name, part, pa.concat_tables(tables))

    # its Parquet tables on another thread (Arrow encodes and compresses without the GIL) while this
    # one writes the graphs, the views and the staged Lance rows
    with ThreadPoolExecutor(1, thread_name_prefix="memlib-part") as pool:
        tables_written = pool.submit(write_tables)
        nodes_path = _write_views(writer, part, tenants, built, dim, early)
        tables_written.result()
    if early is not None:
        early.wait()
    return part, nodes_path


def _write_views(writer: Any, part: str, tenants: list[str], built: list[dict[str, Any]], dim: int,
                 early: EarlyPart | None) -> str:
    """The graphs, the views and the staged Lance rows of a part (:func:`write_part`; the rows
    unless ``early`` wrote them) into ``writer``'s version; returns the staged nodes file."""
    from memlib.graph.memory_arrays import memory_table_from_nodes
    from memlib.io.memory_view import VIEW_MEMORY
    from memlib.io.views import VIEW_NODES, VIEW_TURNS, ordered, view_path, write_view

    version_dir = writer.version_dir
    writer.write_graphs(part, {k: v for t in built for k, v in t["graphs"].items() if v is not None})
    # what a server maps to open a tenant; its token-matrix reference kept with its turns
    refs = {tenant: {"matrix_ref": {k: v for k, v in t["matrix_refs"].to_pylist()[0].items() if k != "tenant_id"}}
            for tenant, t in zip(tenants, built) if t.get("matrix_refs") is not None and t["matrix_refs"].num_rows}
    by_tenant = dict(zip(tenants, built))
    write_view(view_path(version_dir, VIEW_NODES, part), VIEW_NODES, {k: t["nodes"] for k, t in by_tenant.items()})
    write_view(view_path(version_dir, VIEW_TURNS, part), VIEW_TURNS, {k: t["turns"] for k, t in by_tenant.items()},
               refs)
    # what auto's memory signals read: fact and event vectors, their citations, the graph's arrays
    # (without it, a part's tenants read Lance and the graph file: docs/decisions/0036-memory-view.md)
    try:
        # the graph built in this process when it is at hand (what its bytes load back to), else its bytes
        memory = {k: memory_table_from_nodes(t["nodes"], ordered(VIEW_TURNS, t["turns"]),
                                             (t.get("memory_graphs") or t["graphs"]).get(k), dim)
                  for k, t in by_tenant.items()}
        write_view(view_path(version_dir, VIEW_MEMORY, part), VIEW_MEMORY, {k: m[0] for k, m in memory.items()},
                   {k: m[1] for k, m in memory.items()})
    except Exception as exc:  # noqa: BLE001 - an optimization never fails a part
        log.warning("part %s: no memory view (%s: %s)", part, type(exc).__name__, str(exc)[:160])
    written = early.nodes_path() if early is not None else None
    return written if written is not None else _write_staged(version_dir, part, [t["lance_rows"] for t in built])


def _write_staged(version_dir: Path, part: str, rows: list[pa.Table]) -> str:
    """The rows the driver writes to Lance: a tenant's changed rows, or all of them (lance_delta);
    read once by the driver, then removed: written plain (zstd was a third of the part's writing)."""
    from memlib.io.files import PLAIN, replace_parquet
    from pipelines.shard import staged_path

    nodes = pa.concat_tables(rows, promote_options="permissive")
    return str(replace_parquet(nodes, staged_path(version_dir, "nodes", part), **PLAIN))
