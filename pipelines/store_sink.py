"""Helpers of the build's writes: importance joined into nodes, staging cleanup.

Importance (from the graph stage) is joined into each tenant's nodes before they are staged
for the Lance write; the staged files are removed once written, so the version directory
holds only the published tables.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa

from memlib.io.store import StoreWriter
from pipelines.shard import STAGED


def with_importance(nodes: pa.Table, importance: pa.Table | None) -> pa.Table:
    """``nodes`` with ``importance`` taken from an importance table (node_id, importance)."""
    if importance is None or importance.num_rows == 0:
        return nodes
    imp = pl.from_arrow(importance.select(["node_id", "importance"])).with_columns(
        pl.col("importance").cast(pl.Float32).alias("_imp")).select("node_id", "_imp")
    df = pl.from_arrow(nodes).join(imp, on="node_id", how="left", maintain_order="left")
    df = df.with_columns(pl.coalesce("_imp", "importance").alias("importance")).drop("_imp")
    return df.to_arrow()


def drop_staging(writer: StoreWriter) -> None:
    """Remove the version's staged inputs and nodes (its published tables are in its parts)."""
    shutil.rmtree(Path(writer.version_dir) / STAGED, ignore_errors=True)
