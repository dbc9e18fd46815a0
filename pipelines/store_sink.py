"""Driver side of the build: stream staged per-tenant nodes into Lance, one tenant at a time.

Importance (from the graph stage, when it ran) is joined into each tenant's nodes before the
Lance write; the staged files are removed once written, so the version directory holds
only the published tables.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from memlib import schema
from memlib.io.store import StoreWriter
from pipelines.shard import TenantShard


def with_importance(nodes: pa.Table, importance: pa.Table | None) -> pa.Table:
    """``nodes`` with ``importance`` taken from an importance table (node_id, importance)."""
    if importance is None or importance.num_rows == 0:
        return nodes
    imp = pl.from_arrow(importance.select(["node_id", "importance"])).with_columns(
        pl.col("importance").cast(pl.Float32).alias("_imp")).select("node_id", "_imp")
    df = pl.from_arrow(nodes).join(imp, on="node_id", how="left", maintain_order="left")
    df = df.with_columns(pl.coalesce("_imp", "importance").alias("importance")).drop("_imp")
    return df.to_arrow()


def write_nodes(writer: StoreWriter, shards: list[TenantShard],
                importance: dict[str, pa.Table] | None = None) -> int:
    """Replace each tenant's nodes in Lance (one tenant in memory at a time); returns node rows written."""
    written = 0
    first = True
    for shard in sorted(shards, key=lambda s: s.tenant_id):
        path = Path(shard.nodes_path)
        if not path.exists():
            continue
        nodes = with_importance(pq.read_table(path), (importance or {}).get(shard.tenant_id))
        nodes = schema.conform(nodes, schema.nodes_schema(writer.dim), name="nodes")
        # the first write also clears tenants that are gone from the input
        tenants = _all_lance_tenants(writer) if first else [shard.tenant_id]
        writer.replace_tenant_nodes(tenants, nodes)
        written += nodes.num_rows
        first = False
    return written


def _all_lance_tenants(writer: StoreWriter) -> list[str]:
    tbl = writer.open_nodes()
    if tbl.count_rows() == 0:
        return []
    return pl.from_arrow(tbl.search().select(["tenant_id"]).limit(None).to_arrow()) \
        .get_column("tenant_id").unique().to_list()


def store_dir_of(shard: TenantShard) -> Path:
    """The store directory a shard belongs to (``STORE/versions/vN/turns/<tenant>.parquet``)."""
    version_dir = Path(shard.turns_path).parent.parent
    if version_dir.parent.name != "versions":
        raise ValueError(f"{shard.turns_path} is not inside a store version directory")
    return version_dir.parent.parent


def write_llm_calls(shard: TenantShard, calls: pa.Table | None) -> Path | None:
    """The tenant's ``llm_calls`` partition of this version (every call, errors included)."""
    if calls is None or calls.num_rows == 0:
        return None
    path = Path(shard.turns_path).parent.parent / "llm_calls" / Path(shard.turns_path).name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(schema.conform(calls, schema.LLM_CALLS, name="llm_calls"), tmp, compression="zstd")
    tmp.replace(path)
    return path


def drop_staging(writer: StoreWriter, shards: list[TenantShard]) -> None:
    dirs = {Path(s.nodes_path).parent for s in shards}
    for d in dirs:
        if d.is_relative_to(writer.version_dir):
            shutil.rmtree(d, ignore_errors=True)
