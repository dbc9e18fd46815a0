"""The checks a :class:`memlib.io.store.StoreReader` makes of its version's files and Lance rows against
the checksums its manifest records (docs/decisions/0031-kept-file-checksums.md)."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from memlib.io.checksums import GRAPH, LANCE, MEMORY_VIEW, DamagedFileError, check, check_size, unchanged_since_checked
from memlib.io.lance_checks import LANCE_DATA_KEY, LANCE_DIGEST_KEY, LANCE_FILES_KEY, rows_digest
from memlib.io.parts import GRAPHS
from memlib.io.views import VIEW_MEMORY

FILES_KEY = "files"  # version file (relative path) -> [size, crc32, mtime_ns] (memlib/io/checksums.py)
LANCE_TABLES = {"nodes": "nodes.lance", "turn_text": "turn_text.lance"}
LANCE_VERSION_KEYS = {"nodes": "lance_version", "turn_text": "lance_turn_text_version"}  # manifest keys

# (store, Lance table, its version, tenant) whose rows had their digest in this process: a tenant's
# rows are read and hashed once per process and version, like a file once per identity
_ROWS_OK: set[tuple[str, str, int, str]] = set()
_ROWS_BAD: dict[tuple[str, str, int, str], str] = {}  # and those whose rows did not: why
_ROWS_LOCK = threading.Lock()


def forget_rows() -> None:
    """Check every tenant's Lance rows again on their next read (tests)."""
    with _ROWS_LOCK:
        _ROWS_OK.clear()
        _ROWS_BAD.clear()


class ReaderChecks:
    """What a reader checks (``self.manifest``, ``self.path``, ``self.version_dir``, ``self.part_of``,
    the pinned Lance tables: :class:`memlib.io.store.StoreReader`)."""

    manifest: dict[str, Any]
    path: Path
    version_dir: Path
    part_of: Callable[[str], str]  # tenant -> the part holding its files

    def damage(self, tenant: str, *, contents: bool = True, changed_only: bool = False) -> list[DamagedFileError]:
        """The files of ``tenant``'s part whose size, or with ``contents`` whose checksum, is not the
        one published (versions before checksums: none); a graph file's error has ``part`` GRAPH.
        ``changed_only``: a file with the size and mtime it had when last hashed is not hashed
        again (what a nightly checks of the tenants it carries: a stat each, and the bytes of a
        file written since)."""
        if self.__dict__.get("_by_part") is None:  # part -> its files, once (thousands at 10,000 tenants)
            self._by_part: dict[str, list] = {}
            for rel, expected in (self.manifest.get(FILES_KEY) or {}).items():
                self._by_part.setdefault(Path(rel).name.split(".", 1)[0], []).append((rel, expected))
        out = []
        for rel, expected in self._by_part.get(self.part_of(tenant), []):
            path = self.version_dir / rel
            top = Path(rel).parts[0]
            part = GRAPH if top == GRAPHS else MEMORY_VIEW if top == VIEW_MEMORY else None
            if changed_only and unchanged_since_checked(path, expected):
                continue
            try:
                check(path, expected, part) if contents else check_size(path, expected)
            except DamagedFileError as exc:
                out.append(exc if exc.part == part else DamagedFileError(str(exc), part=part))
            except OSError as exc:
                out.append(DamagedFileError(str(exc), part=part))
        return out

    def damaged_files(self, tenant: str, *, contents: bool = True, changed_only: bool = False) -> list[str]:
        """:meth:`damage` as lines, each naming its path."""
        return [str(e) for e in self.damage(tenant, contents=contents, changed_only=changed_only)]


    # -- Lance -------------------------------------------------------------------------------
    def lance_table(self, name: str):
        """The pinned Lance table ``name`` (``nodes``, ``turn_text``; None: a store without it);
        :class:`DamagedFileError` (part LANCE) when it cannot be opened at that version."""
        try:
            return self.nodes_table() if name == "nodes" else self.turn_text_table()
        except Exception as exc:  # noqa: BLE001 - Lance raises errors of many kinds for a damaged file
            raise DamagedFileError(f"lance {name} table unreadable at its published version: "
                                   f"{' '.join(str(exc).split())[:160]}", part=LANCE) from None

    def check_lance_files(self, name: str) -> None:
        """Raise :class:`DamagedFileError` (part LANCE) unless the manifest and index files of the
        pinned version of Lance table ``name`` have the checksums published (each hashed once per
        identity in this process)."""
        prefix = LANCE_TABLES[name] + "/"
        for rel, expected in (self.manifest.get(LANCE_FILES_KEY) or {}).items():
            if rel.startswith(prefix):
                check(self.path / "lance" / rel, expected, LANCE)

    def lance_rows(self, tenant: str, name: str = "nodes", *, files: bool = True) -> pa.Table:
        """``tenant``'s rows of Lance table ``name`` at the pinned version, every column, checked
        against the digest the manifest records for them (and with ``files`` the table's index and
        manifest files); :class:`DamagedFileError` (part LANCE) when they differ or cannot be read."""
        rows = self.unchecked_rows(tenant, name)
        self.check_rows(tenant, name, rows, files=files)
        return rows

    def unchecked_rows(self, tenant: str, name: str = "nodes") -> pa.Table:
        """``tenant``'s rows of Lance table ``name`` at the pinned version, every column, NOT checked:
        nothing is made of them for a caller before :meth:`check_rows` of them returned
        (:func:`memlib.compose.reuse.load_previous` checks them while it reads them);
        :class:`DamagedFileError` (part LANCE) when they cannot be read."""
        tbl = self.lance_table(name)
        if tbl is None:
            return pa.table({})
        try:
            return tbl.search().where(f"tenant_id = {_sql(tenant)}").limit(None).to_arrow()
        except Exception as exc:  # noqa: BLE001 - Lance raises errors of many kinds for a damaged file
            raise DamagedFileError(f"lance {name} rows of tenant {tenant!r} unreadable: "
                                   f"{' '.join(str(exc).split())[:160]}", part=LANCE) from None

    def check_rows(self, tenant: str, name: str, rows: pa.Table, *, files: bool = True) -> None:
        """Raise :class:`DamagedFileError` (part LANCE) unless ``rows`` (:meth:`unchecked_rows`) have the
        digest the manifest records for ``tenant``'s rows of table ``name`` (with ``files``: and the
        table's index and manifest files their checksums; then they are known good in this process)."""
        if self.lance_table(name) is not None:
            self._check_digest(tenant, name, rows, files)

    def check_lance_rows(self, tenant: str, name: str = "nodes") -> None:
        """:meth:`lance_rows` once per process, store, table version and tenant (a failure is
        remembered too: not read again on every query)."""
        if (self.manifest.get("tenants", {}).get(tenant) or {}).get(LANCE_DIGEST_KEY) is None:
            return  # written before digests: read as it is
        key = (str(self.path), name, self.manifest.get(LANCE_VERSION_KEYS[name]), tenant)
        with _ROWS_LOCK:
            if key in _ROWS_OK:
                return
            if key in _ROWS_BAD:
                raise DamagedFileError(_ROWS_BAD[key], part=LANCE)
        try:
            self.check_lance_files(name)  # before Lance opens them
            self.lance_rows(tenant, name)
        except DamagedFileError as exc:
            with _ROWS_LOCK:
                _ROWS_BAD[key] = str(exc)
            raise

    def checked_rows(self, tenant: str, columns: list[str]) -> pa.Table:
        """``columns`` of ``tenant``'s Lance nodes rows: every column read and checked the first time
        in this process (:meth:`check_lance_rows`), only ``columns`` after that."""
        key = (str(self.path), "nodes", self.manifest.get(LANCE_VERSION_KEYS["nodes"]), tenant)
        with _ROWS_LOCK:
            known = key in _ROWS_OK or key in _ROWS_BAD
        digest = (self.manifest.get("tenants", {}).get(tenant) or {}).get(LANCE_DIGEST_KEY)
        if digest is not None and not known:
            try:
                self.check_lance_files("nodes")
                rows = self.lance_rows(tenant, "nodes")
            except DamagedFileError as exc:
                with _ROWS_LOCK:
                    _ROWS_BAD[key] = str(exc)
                raise
            return rows.select(columns)
        self.check_lance_rows(tenant, "nodes")  # a failure remembered is raised again
        tbl = self.lance_table("nodes")
        try:
            return tbl.search().where(f"tenant_id = {_sql(tenant)}").select(columns).limit(None).to_arrow()
        except Exception as exc:  # noqa: BLE001 - Lance raises errors of many kinds for a damaged file
            raise DamagedFileError(f"lance nodes rows of tenant {tenant!r} unreadable: "
                                   f"{' '.join(str(exc).split())[:160]}", part=LANCE) from None

    def _check_digest(self, tenant: str, name: str, rows: pa.Table, files: bool) -> None:
        want = ((self.manifest.get("tenants", {}).get(tenant) or {}).get(LANCE_DIGEST_KEY) or {}).get(name)
        if want is None:  # written before digests: read as it is
            return
        if files:
            self.check_lance_files(name)
        got = rows_digest(rows, name)
        if got != [int(want[0]), int(want[1])]:
            raise DamagedFileError(f"lance {name} rows of tenant {tenant!r} are not the ones written ({got[0]} rows, "
                                   f"checksum {got[1]:08x}; {int(want[0])} rows, {int(want[1]):08x} were written)",
                                   part=LANCE)
        if files:
            with _ROWS_LOCK:
                _ROWS_OK.add((str(self.path), name, self.manifest.get(LANCE_VERSION_KEYS[name]), tenant))

    def lance_data_damage(self) -> list[DamagedFileError]:
        """The Lance data and deletion files written since their checksum was computed (their size or
        mtime differ) whose bytes are not the ones written, or gone (a stat each for the others)."""
        out = []
        for rel, expected in (self.manifest.get(LANCE_DATA_KEY) or {}).items():
            path = self.path / "lance" / rel
            if not unchanged_since_checked(path, expected):
                try:
                    check(path, expected, LANCE)
                except DamagedFileError as exc:
                    out.append(exc)
        return out

    def lance_damage(self, tenant: str) -> list[DamagedFileError]:
        """What is wrong with ``tenant``'s rows of either Lance table (``memlib verify``)."""
        out = []
        for name in LANCE_TABLES:
            try:
                self.lance_rows(tenant, name, files=False)
            except DamagedFileError as exc:
                out.append(exc)
        return out


def _sql(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"
