"""Helpers of the build's writes: importance joined into nodes, a tenant's llm_calls, staging cleanup.

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
