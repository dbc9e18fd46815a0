"""Generic Parquet reader: the JSONL columns as a table, one row per turn or question.

Each tenant is read with a polars lazy scan filtered on ``tenant_id`` (predicate pushdown
skips row groups of other tenants when the file is sorted by tenant, the recommended
layout), so memory holds one tenant at a time.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from memlib.config import IOConfig
from memlib.io.builder import TenantBuilder
from memlib.io.errors import InputError
from memlib.io.fields import missing_columns
from memlib.io.generic import add_object
from memlib.io.jsonarray import record_hash
from memlib.io.result import ReadResult
from memlib.io.validate import parse_iso_time

_ROW = "_row"


def _scan(path: str | Path) -> pl.LazyFrame:
    p = Path(path)
    if not p.is_file():
        raise InputError(p, "file not found")
    try:
        names = pq.read_schema(p).names
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(p, f"not a Parquet file: {str(exc).splitlines()[0][:200]}") from exc
    if pq.read_metadata(p).num_rows == 0:
        raise InputError(p, "Parquet file has no rows")
    problem = missing_columns(names)
    if problem and not _only_questions(p, names):
        raise InputError(p, problem)
    if "tenant_id" not in names:
        raise InputError(p, "Parquet file has no tenant_id column")
    return pl.scan_parquet(p).with_row_index(_ROW, offset=1)


def _only_questions(path: Path, names: list[str]) -> bool:
    """Whether every row is a question record (which needs no turn columns)."""
    if "kind" not in names:
        return False
    kinds = _collect(pl.scan_parquet(path).select(pl.col("kind").fill_null("turn").unique()), path)
    return kinds.get_column("kind").to_list() == ["question"]


def _collect(lf: pl.LazyFrame, path: str | Path) -> pl.DataFrame:
    """Collect, turning a corrupt page or an unreadable column into :class:`InputError`."""
    try:
        return lf.collect()
    except (pl.exceptions.PolarsError, pa.ArrowException, OSError) as exc:
        raise InputError(path, f"unreadable Parquet data: {str(exc).splitlines()[0][:200]}") from None


def _tenants(lf: pl.LazyFrame, path: str | Path) -> list[str | None]:
    return _collect(lf.select(pl.col("tenant_id").unique(maintain_order=True)), path).get_column("tenant_id").to_list()


def _frame(lf: pl.LazyFrame, tenant: str | None, path: str | Path) -> pl.DataFrame:
    cond = pl.col("tenant_id").is_null() if tenant is None else pl.col("tenant_id") == tenant
    return _collect(lf.filter(cond), path)


def _tenant_result(df: pl.DataFrame, source: str, cfg: IOConfig) -> ReadResult:
    b = TenantBuilder(source, cfg, parse_iso_time, require_time=False)
    for row in df.to_dicts():
        where = f"row {row.pop(_ROW)}"
        add_object(b, row, where, row)
    return b.result()


def iter_tenants(path: str | Path, cfg: IOConfig) -> Iterator[ReadResult]:
    lf = _scan(path)
    for tenant in _tenants(lf, path):
        yield _tenant_result(_frame(lf, tenant, path), str(path), cfg)


def _batch_frames(lf: pl.LazyFrame, path: str | Path, batch_rows: int) -> Iterator[pl.DataFrame]:
    """The rows of consecutive tenants (in file order) up to ``batch_rows`` rows, a larger tenant
    alone, each frame read with one scan (rows without a tenant: a frame of their own)."""
    sizes = _collect(lf.group_by("tenant_id", maintain_order=True).len(), path).rows()
    group: list[str] = []
    n = 0
    for tenant, rows in sizes + [(None, 0)]:
        if group and (tenant is None or n + rows > batch_rows):
            yield _collect(lf.filter(pl.col("tenant_id").is_in(group)), path)
            group, n = [], 0
        if tenant is None:
            if rows:
                yield _frame(lf, None, path)
            continue
        group.append(tenant)
        n += rows


def iter_batches(path: str | Path, cfg: IOConfig, batch_rows: int) -> Iterator[ReadResult]:
    """Whole tenants, several to a result (see :func:`_batch_frames`); each tenant's tables are
    what :func:`iter_tenants` gives for it."""
    for df in _batch_frames(_scan(path), path, batch_rows):
        yield _tenant_result(df, str(path), cfg)


FINGERPRINT_BATCH_ROWS = 50_000


def fingerprints(path: str | Path) -> dict[str, str]:
    out = {}
    for df in _batch_frames(_scan(path), path, FINGERPRINT_BATCH_ROWS):
        for (tenant,), part in df.partition_by("tenant_id", as_dict=True, maintain_order=True).items():
            out[tenant if isinstance(tenant, str) else ""] = record_hash(part.drop(_ROW).to_dicts())
    return out
