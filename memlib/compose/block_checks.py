"""Checksums of kept session blocks (memlib/compose/session_store.py): a block's index file, the
commit point written after the block's files, names the size and CRC-32 of each of them in its
Parquet metadata; each file is checked before it is read, once per file identity in a process
(memlib/io/checksums.py). A block whose bytes are not the ones written is never read: the build
drops it and computes its sessions again, the service reports its tenants unavailable
(docs/decisions/0031-kept-file-checksums.md). Each checksum also names the file's mtime when it
was hashed; a build's store (``trust_unchanged``) hashes only the files written since, as it does
the published files it carries (docs/decisions/0038-kept-blocks-by-mtime.md)."""
from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from memlib.compose.kept_tokens import INT8T_FILE
from memlib.compose.sessions import SESSION_TABLES
from memlib.io import checksums
from memlib.io.checksums import DamagedFileError
from memlib.io.files import replace_parquet

log = logging.getLogger("memlib.compose")
SUMS_KEY = b"memlib.checksums"  # the index file's metadata: block file name -> [size, crc32]
VECTORS_FILE = "turn_vectors.arrow"
BLOCK_FILES = (*(f"{n}.arrow" for n in SESSION_TABLES), *(f"{n}.parquet" for n in SESSION_TABLES),
               VECTORS_FILE, INT8T_FILE)  # the files that exist (session tables: .parquet in older blocks)

__all__ = ["BlockChecks", "DamagedFileError"]


class BlockChecks:
    """What :class:`SessionStore` does with its blocks' checksums (it has ``root``, ``index()``,
    ``_read``: block -> (signature, index rows, checksums), ``unreadable`` and ``_index``)."""

    root: Path
    _read: dict
    unreadable: dict[str, str]
    trust_unchanged: bool = False  # a file with the size and mtime it was hashed at is not hashed again

    def _commit(self, block: str, index: pa.Table) -> None:
        """Write the block's index file, naming the checksums of the files written before it."""
        sums = checksums.crcs_of(self.root / "blocks" / block, list(BLOCK_FILES), mtimes=True)
        self._write_index(block, index, sums)

    def _write_index(self, block: str, index: pa.Table, sums: dict) -> None:
        replace_parquet(index.replace_schema_metadata({SUMS_KEY: json.dumps(sums, sort_keys=True).encode()}),
                        self.root / "index" / f"{block}.parquet")

    def _read_index(self, f: Path) -> tuple[pa.Table, dict] | None:
        """An index file's rows and its block's checksums; None (logged, and listed as unreadable)
        when it cannot be read: its block counts as not kept."""
        try:
            t = pq.read_table(f)
            sums = json.loads((t.schema.metadata or {}).get(SUMS_KEY, b"{}"))
            if not isinstance(sums, dict):
                raise ValueError("checksums are not an object")
        except (OSError, pa.ArrowException, ValueError) as exc:
            log.warning("kept block index %s unreadable, its sessions count as not kept: %s", f, str(exc)[:160])
            self.unreadable[f.stem] = " ".join(str(exc).split())[:200]
            return None
        self.unreadable.pop(f.stem, None)
        return t.replace_schema_metadata(None), sums

    def _checked(self, bdir: Path, name: str) -> Path:
        """``bdir/name``, once its bytes have the checksum its index file names (blocks kept before
        checksums were are read as they are)."""
        expected = self._read.get(bdir.name, (None, None, {}))[2].get(name)
        if expected is None:
            return bdir / name
        if not (self.trust_unchanged and checksums.unchanged_since_checked(bdir / name, expected)):
            checksums.check(bdir / name, expected)
        return bdir / name

    def record_mtimes(self, blocks: Iterable[str]) -> int:
        """Give the checksums of ``blocks`` that name no mtime (kept before they did) the mtime at
        which this process found their bytes whole, rewriting those index files; the number
        rewritten. Only a build calls it (it holds the store's lock)."""
        done = 0
        for b in sorted(set(blocks)):
            known = self._read.get(b)
            if known is None or all(len(e) > 2 for e in known[2].values()):
                continue
            bdir = self.root / "blocks" / b
            sums = {n: checksums.carried_entry(bdir / n, bdir / n, list(e)) for n, e in known[2].items()}
            if all(len(e) > 2 for e in sums.values()):
                index = pq.read_table(self.root / "index" / f"{b}.parquet")
                self._write_index(b, index, sums)
                done += 1
        if done:
            self._index = None
        return done

    def verify(self, blocks: Iterable[str] | None = None) -> dict[str, str]:
        """Block -> why it is damaged, of ``blocks`` (every kept block when None): each file its
        index names is checked, and an unreadable index file counts."""
        listed = set(self.index().column("block").to_pylist())
        todo = sorted(listed if blocks is None else set(blocks) & listed)
        bad = {b: f"index file unreadable: {why}" for b, why in self.unreadable.items()
               if blocks is None or b in set(blocks)}
        for b in todo:
            for name in sorted(self._read.get(b, (None, None, {}))[2]):
                try:
                    self._checked(self.root / "blocks" / b, name)
                except DamagedFileError as exc:
                    bad[b] = str(exc)
                    break
        return bad

    def unchecked(self) -> list[str]:
        """Kept blocks whose index names no checksums (kept before they were; read as they are)."""
        return sorted(b for b, known in self._read.items() if not known[2])

    def drop(self, blocks: Iterable[str]) -> None:
        """Remove kept blocks (damaged ones: the build computes their sessions again)."""
        for b in blocks:
            (self.root / "index" / f"{b}.parquet").unlink(missing_ok=True)
            shutil.rmtree(self.root / "blocks" / b, ignore_errors=True)
            self.unreadable.pop(b, None)
        self._index = None
