"""The store's file primitives: safe part names, the one atomic writer (a hidden temporary file
beside the target, then a rename; fsync for the JSON that publishes), hard links, part names and
per-tenant filtering. Every file of a store is written through :func:`atomic_write`."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class StoreError(RuntimeError):
    pass


def safe_name(name: str) -> str:
    if not _SAFE_NAME.fullmatch(name):
        raise StoreError(f"unsafe file name for a store partition: {name!r}")
    return name


TEMP_PREFIX = ".tmp-"  # a file being written: no reader lists it (hidden, and not of its kind's suffix)


def atomic_write(path: Path, write: Callable[[BinaryIO], object], *, durable: bool = False) -> Path:
    """Write ``path`` atomically: ``write`` fills a temporary file beside it, named uniquely (so
    two processes writing one path never share it), then a rename replaces ``path``. ``durable``:
    the file reaches the disk before the rename (what publishes a version)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: Path, data: Any, *, durable: bool = True, indent: int | None = 2) -> Path:
    text = json.dumps(data, indent=indent, sort_keys=indent is not None, default=str, ensure_ascii=False)
    return atomic_write(path, lambda fh: fh.write(text.encode("utf-8")), durable=durable)


def replace_parquet(table: pa.Table, path: Path, compression: str | dict[str, str] = "zstd",
                    use_dictionary: bool | list[str] = True) -> Path:
    """Write ``table`` at ``path`` atomically, as Parquet."""
    return atomic_write(path, lambda fh: pq.write_table(table, fh, compression=compression,
                                                        use_dictionary=use_dictionary))


def replace_arrow(table: pa.Table, path: Path) -> Path:
    """Write ``table`` at ``path`` atomically, as an uncompressed Arrow IPC file (memory-mappable)."""
    def write(fh: BinaryIO) -> None:
        with pa.ipc.new_file(fh, table.schema) as writer:
            writer.write_table(table)

    return atomic_write(path, write)


# Parquet options (docs/decisions/0040-nightly-part-costs.md): zstd, a part's default; LZ4 with a
# dictionary only for the tenant column, for a table read by the next build alone; PLAIN (no
# compression), for a file a run writes and reads once, then removes
ZSTD: dict[str, Any] = {"compression": "zstd"}
LZ4: dict[str, Any] = {"compression": "lz4", "use_dictionary": ["tenant_id"]}
PLAIN: dict[str, Any] = {"compression": "none", "use_dictionary": ["tenant_id"]}


def replace_part(table: pa.Table, path: Path, options: dict[str, Any] | None = None) -> Path:
    """Write a part (rows of whole tenants) atomically as Parquet with one row group per tenant,
    so :func:`read_tenant` of one tenant reads its row group alone (the row groups' statistics
    name their tenant). The rows are kept in their order within each tenant. ``options``: the
    Parquet writer's (default :data:`ZSTD`)."""
    options = options or ZSTD
    tenants = table.column("tenant_id")
    if table.num_rows == 0 or pc.count_distinct(tenants, mode="all").as_py() <= 1:
        return atomic_write(path, lambda fh: pq.write_table(table, fh, **options))
    order = pc.sort_indices(table, sort_keys=[("tenant_id", "ascending")])  # stable
    table = table.take(order)
    values = table.column("tenant_id").to_pylist()
    cuts = [0] + [i for i in range(1, len(values)) if values[i] != values[i - 1]] + [len(values)]

    def write(fh: BinaryIO) -> None:
        with pq.ParquetWriter(fh, table.schema, **options) as writer:
            for a, b in zip(cuts, cuts[1:]):
                writer.write_table(table.slice(a, b - a), row_group_size=b - a)

    return atomic_write(path, write)


def read_tenant(path: Path, tenant: str, columns: list[str] | None = None) -> pa.Table:
    """``tenant``'s rows of a part file: only the row groups whose statistics may hold it are read
    (a part written by :func:`replace_part`: its own row group)."""
    cols = None if columns is None else list(dict.fromkeys([*columns, "tenant_id"]))
    try:
        f = pq.ParquetFile(path)
        meta, idx = f.metadata, f.schema_arrow.get_field_index("tenant_id")
        groups = []
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(idx).statistics
            if st is None or not st.has_min_max or st.min <= tenant <= st.max:
                groups.append(g)
        t = f.read_row_groups(groups, columns=cols) if groups else f.schema_arrow.empty_table()
    except (OSError, pa.ArrowException) as exc:  # a damaged file: the error names it
        raise type(exc)(f"{path}: {exc}") from exc
    t = of_tenants(t, [tenant]) if t.num_rows else (t if cols is None else t.select(cols))
    return t if columns is None else t.select(columns)


def link_or_copy(src: Path, dst: Path) -> None:
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def part_id(tenants: Iterable[str], salt: str) -> str:
    """The name of the part holding ``tenants`` (a content hash: a retried row names the same part)."""
    h = hashlib.sha256(salt.encode("utf-8"))
    for t in sorted(tenants):
        h.update(b"\n" + t.encode("utf-8"))
    return f"part-{h.hexdigest()[:20]}"


def of_tenants(table: pa.Table, tenants: Iterable[str]) -> pa.Table:
    """The rows of ``table`` whose ``tenant_id`` is one of ``tenants``."""
    return table.filter(pc.is_in(table.column("tenant_id"), value_set=pa.array(sorted(set(tenants)), pa.string())))
