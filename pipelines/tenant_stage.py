"""Writing a tenant's staged tables (used by the tenant operator in pipelines/session_stage.py)."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from memlib import schema


def write_parquet(table: pa.Table, path: str, table_schema: pa.Schema, name: str) -> None:
    """Conform and write atomically (temp file + rename)."""
    table = schema.conform(table, table_schema, name=name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
