"""The store's file primitives: safe part names, atomic writes (temp file, fsync for JSON, rename),
hard links, part names and per-tenant filtering. Every file of a store version is written here."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable

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


def atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def replace_parquet(table: pa.Table, path: Path) -> Path:
    """Write ``table`` at ``path`` atomically (a temp file beside it, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return path


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
