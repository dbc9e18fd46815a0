"""Content checksums of kept files: computed when a file is written, checked where it is read, so
that a damaged cache file is never trusted (docs/decisions/0031-kept-file-checksums.md).

A checksum is ``[size, crc32]``; a published file's also names the mtime it had when its bytes
were last hashed (``[size, crc32, mtime_ns]``: a nightly hashes again only the carried files
written since, see :func:`unchanged_since_checked`). CRC-32 finds accidental damage (a torn write, flipped or zeroed
bytes, a truncation), which is what a cache meets; it is no defence against someone who can write
the store anyway. It runs at about 1 GB/s here, so a file is hashed once per identity (path,
inode, size, mtime_ns) in a process: a rewrite (``os.replace``) or an edit in place changes the
identity, a second read of the same file costs one ``stat``.
"""
from __future__ import annotations

import mmap
import os
import threading
import zlib
from pathlib import Path

from memlib.io.files import StoreError

CHUNK = 8 << 20  # bytes hashed per call (zlib releases the GIL for the call)


GRAPH = "graph"  # DamagedFileError.part: a tenant's graph file (the strategies reading no graph still answer)
LANCE = "lance"  # DamagedFileError.part: Lance rows or files (the strategies reading no Lance still answer)
MEMORY_VIEW = "memory_view"  # DamagedFileError.part: a part's memory view (never read; its tenants read around it)


class DamagedFileError(StoreError):
    """A kept file whose bytes are not the ones written: dropped and recomputed by a build, never
    read by the service. ``part``: what of a tenant it is (:data:`GRAPH`, :data:`LANCE`; None: the
    files every strategy reads)."""

    def __init__(self, message: str, *, part: str | None = None):
        super().__init__(message)
        self.part = part


def crc_of(path: Path) -> list[int]:
    """``[size, crc32]`` of the file at ``path``."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        crc = 0
        if size:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
                view = memoryview(m)
                try:
                    for at in range(0, size, CHUNK):
                        crc = zlib.crc32(view[at:at + CHUNK], crc)
                finally:
                    view.release()
    return [size, crc]


def crcs_of(directory: Path, names: list[str], mtimes: bool = False) -> dict[str, list[int]]:
    """The checksums of the files ``names`` of ``directory`` that exist; with ``mtimes``, each
    ``[size, crc32, mtime_ns]`` (the mtime it had when hashed, see :func:`unchanged_since_checked`)."""
    out = {}
    for n in names:
        if (directory / n).is_file():
            out[n] = crc_of(directory / n) + ([os.stat(directory / n).st_mtime_ns] if mtimes else [])
    return out


_VERIFIED: dict[str, tuple[int, int, int, int]] = {}  # path -> identity checked against its crc
_LOCK = threading.Lock()


def identity(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def check(path: Path, expected: list[int] | tuple[int, ...], part: str | None = None) -> None:
    """Raise :class:`DamagedFileError` naming ``path`` (of ``part``) unless its bytes have the
    checksum ``expected`` (a file already checked with this identity and checksum is not hashed again)."""
    size, crc = int(expected[0]), int(expected[1])
    try:
        ino, now, mtime = identity(path)
    except FileNotFoundError:
        raise DamagedFileError(f"{path}: missing", part=part) from None
    key = (ino, now, mtime, crc)
    with _LOCK:
        if _VERIFIED.get(str(path)) == key:
            return
    if now != size:
        raise DamagedFileError(f"{path}: {now} bytes, {size} were written", part=part)
    got = crc_of(path)
    if got != [size, crc]:
        raise DamagedFileError(f"{path}: content checksum {got[1]:08x}, {crc:08x} was written", part=part)
    with _LOCK:
        _VERIFIED[str(path)] = key


def check_size(path: Path, expected: list[int] | tuple[int, int]) -> None:
    """The cheap part of :func:`check`: ``path`` exists with the size written."""
    size = os.stat(path).st_size
    if size != int(expected[0]):
        raise DamagedFileError(f"{path}: {size} bytes, {int(expected[0])} were written")


def forget(paths: list[Path] | None = None) -> None:
    """Check ``paths`` (every file when None) again on their next read (tests; a dropped entry)."""
    with _LOCK:
        if paths is None:
            _VERIFIED.clear()
        for p in paths or []:
            _VERIFIED.pop(str(p), None)


def tree_crcs(directory: Path, base: Path | None = None,
              known: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
    """``[size, crc32]`` of every file under ``directory`` by relative path (work directories,
    ``_*``, and temporaries, ``.*``, left out); a file that is a hard link of the same path under
    ``base`` (carried over unchanged) takes its checksum from ``known`` instead of being hashed."""
    out: dict[str, list[int]] = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if any(p.startswith(("_", ".")) for p in rel.parts) or not path.is_file():
            continue
        key = rel.as_posix()
        if known and key in known and base is not None:
            try:
                if os.path.samefile(path, base / rel):
                    out[key] = carried_entry(path, base / rel, list(known[key]))
                    continue
            except OSError:
                pass
        mtime = os.stat(path).st_mtime_ns
        out[key] = [*crc_of(path), mtime]
    return out


def carried_entry(path: Path, published: Path, entry: list[int]) -> list[int]:
    """A carried file's entry: its published ``[size, crc32, mtime_ns]``, with the mtime it has now
    when this process checked its bytes at that mtime (a file touched but whole; an entry written
    before mtimes gets one once checked)."""
    st = os.stat(path)
    if len(entry) > 2 and entry[2] == st.st_mtime_ns:
        return entry
    with _LOCK:
        seen = _VERIFIED.get(str(published))
    if seen == (st.st_ino, st.st_size, st.st_mtime_ns, int(entry[1])):
        return [int(entry[0]), int(entry[1]), st.st_mtime_ns]
    return entry


def unchanged_since_checked(path: Path, expected: list[int] | tuple[int, ...]) -> bool:
    """Whether ``path`` has the size and mtime it had when its checksum ``expected`` (``[size, crc32,
    mtime_ns]``) was computed or last checked: a write since (an edit in place, a truncation, a
    copy over it) changes the mtime; damage below the file system (the medium) does not."""
    if len(expected) < 3:
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_size == int(expected[0]) and st.st_mtime_ns == int(expected[2])
