"""A tenant row's part of the version: the staged tables of the tenants one tenant operator row
built (:meth:`pipelines.tenant_op.TenantOp.build_one`), their graphs, their views and the Lance
rows the driver writes."""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from memlib import schema

log = logging.getLogger("memlib.build")


def write_part(version_dir: str | Path, built: list[dict[str, Any]], dim: int) -> tuple[str, str]:
    """Write the tables of the tenants of one row (each a dict of table -> Arrow table, see
    :meth:`TenantOp.build_one`) as one part of the version; returns the part's name and its
    staged nodes file."""
    from memlib.io.store import TENANT_TABLES, StoreWriter, part_id

    version_dir = Path(version_dir)
    writer = StoreWriter.into(version_dir)
    tenants = [next(iter(t["graphs"])) for t in built]
    part = part_id(tenants, version_dir.name)

    def write_tables() -> None:
        for name in TENANT_TABLES:
            tables = [schema.conform(t[name], schema.TABLES[name], name=name) for t in built
                      if t.get(name) is not None and t[name].num_rows]
            if tables:
                writer.write_table(name, part, pa.concat_tables(tables))

    # its Parquet tables on another thread (Arrow encodes and compresses without the GIL) while this
    # one writes the graphs, the views and the staged Lance rows
    with ThreadPoolExecutor(1, thread_name_prefix="memlib-part") as pool:
        tables_written = pool.submit(write_tables)
        nodes_path = _write_views(version_dir, writer, part, tenants, built, dim)
        tables_written.result()
    return part, nodes_path


def _write_views(version_dir: Path, writer: Any, part: str, tenants: list[str], built: list[dict[str, Any]],
                 dim: int) -> str:
    """The graphs, the views and the staged Lance rows of a part (:func:`write_part`); returns the
    staged nodes file."""
    from memlib.graph.memory_arrays import memory_table_from_nodes
    from memlib.io.files import PLAIN, replace_parquet
    from memlib.io.memory_view import VIEW_MEMORY
    from memlib.io.views import VIEW_NODES, VIEW_TURNS, ordered, view_path, write_view
    from pipelines.shard import staged_path

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
        # each from its graph in memory (its bytes loaded back were the same arrays, 0.17 s later)
        memory = {k: memory_table_from_nodes(t["nodes"], ordered(VIEW_TURNS, t["turns"]),
                                             (t.get("memory_graphs") or {}).get(k, t["graphs"].get(k)), dim)
                  for k, t in by_tenant.items()}
        write_view(view_path(version_dir, VIEW_MEMORY, part), VIEW_MEMORY, {k: m[0] for k, m in memory.items()},
                   {k: m[1] for k, m in memory.items()})
    except Exception as exc:  # noqa: BLE001 - an optimization never fails a part
        log.warning("part %s: no memory view (%s: %s)", part, type(exc).__name__, str(exc)[:160])
    # the rows the driver writes to Lance: a tenant's changed rows, or all of them (lance_delta);
    # read once by the driver, then removed: written plain (zstd was a third of the part's writing)
    nodes = pa.concat_tables([t["lance_rows"] for t in built], promote_options="permissive")
    return str(replace_parquet(nodes, staged_path(version_dir, "nodes", part), **PLAIN))
