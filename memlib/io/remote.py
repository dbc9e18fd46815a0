"""Inputs on object storage (``s3://``, ``gs://``, ``abfs://``, ``hdfs://`` …) via pyarrow filesystems.

The readers stream local files (ijson, line indexes with ``seek``, polars scans), so a remote
input is first copied, in 8 MiB chunks and never whole in memory, to a local staging
directory, read from there, and deleted afterwards. A URI naming a prefix ("directory")
stages every object under it, which is what ``--incremental`` reads (one source per file).

Credentials and endpoints come from pyarrow's usual sources: the environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` for S3-compatible
servers such as MinIO or Ceph, ``AWS_DEFAULT_REGION``), instance profiles, or URI query
parameters (``s3://bucket/key?endpoint_override=host:9000&scheme=http``). Staging space:
``io.staging_dir`` (config; ``MEMLIB__IO__STAGING_DIR``), else the system temp directory; it
needs room for the input.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from memlib.io.errors import InputError

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_CHUNK = 8 << 20


def is_uri(path: str | os.PathLike) -> bool:
    """True for ``scheme://…`` (object storage and ``file://``), False for plain paths."""
    return bool(_URI.match(str(path)))


def _fs(uri: str):
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as exc:  # unknown scheme, bad bucket, no credentials, …
        raise InputError(uri, f"cannot open object storage URI: {str(exc).splitlines()[0][:200]}") from exc


def _copy(fs, src: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with fs.open_input_stream(src) as fin, dest.open("wb") as fout:
        while chunk := fin.read(_CHUNK):
            fout.write(chunk)


def stage(uri: str, into: Path) -> Path:
    """Copy the object (or every object under the prefix) at ``uri`` below ``into``; return
    the local file or directory that stands for it (same base name)."""
    import pyarrow.fs as pafs

    fs, root = _fs(uri)
    root = root.rstrip("/")
    name = PurePosixPath(root).name or "input"
    try:
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.File:
            local = into / name
            _copy(fs, root, local)
            return local
        if info.type == pafs.FileType.Directory:
            local = into / name
            local.mkdir(parents=True, exist_ok=True)
            for item in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
                if item.type == pafs.FileType.File:
                    _copy(fs, item.path, local / PurePosixPath(item.path).relative_to(root))
            return local
    except OSError as exc:
        raise InputError(uri, f"cannot read from object storage: {str(exc).splitlines()[0][:200]}") from exc
    raise InputError(uri, "no such object or prefix")


@contextmanager
def staged_input(path: str | os.PathLike, staging_dir: str | os.PathLike | None = None) -> Iterator[Path]:
    """``path`` as a local :class:`Path`: unchanged for local paths; for a URI, a copy staged
    under ``staging_dir`` (default: the system temp dir) that is removed when the block ends."""
    if not is_uri(path):
        yield Path(path)
        return
    base = str(staging_dir) if staging_dir else None
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="memlib-input-", dir=base))
    try:
        yield stage(str(path), tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
