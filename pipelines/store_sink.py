"""Helpers of the build's writes: importance joined into nodes, staging cleanup.

Importance (from the graph stage) is joined into each tenant's nodes before they are staged
for the Lance write; the staged files are removed once written, so the version directory
holds only the published tables.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from memlib.io.store import StoreWriter
from pipelines.shard import STAGED


def with_importance(nodes: pa.Table, importance: pa.Table | None) -> pa.Table:
    """``nodes`` with ``importance`` taken from an importance table (node_id, importance; one row
    per node id), where it has the node. Only the importance column is new: a polars join made
    every column again (for the 2,500-session tenant, 20k fresh pages of its 166 MB of vectors
    and texts)."""
    if importance is None or importance.num_rows == 0:
        return nodes
    at = pc.index_in(nodes.column("node_id"), value_set=importance.column("node_id"))
    found = pc.take(importance.column("importance").cast(pa.float32()), at)
    i = nodes.column_names.index("importance")
    merged = pc.coalesce(found, nodes.column("importance").cast(pa.float32()))
    return nodes.set_column(i, pa.field("importance", pa.float32()), merged)


def drop_staging(writer: StoreWriter) -> None:
    """Remove the version's staged inputs and nodes (its published tables are in its parts)."""
    shutil.rmtree(Path(writer.version_dir) / STAGED, ignore_errors=True)
