"""The memory store on disk: versioned Parquet tables, one Lance ``nodes`` table, graphs,
and an atomically swapped ``manifest.json``.

Layout of a store directory: docs/architecture.md ("The store"). A version's Parquet tables
are *parts* (``versions/vN/TABLE/<part>.parquet``): a part holds whole tenants, those built together
in one row of the build or carried together, and the manifest names each tenant's part. A nightly
run hard-links a part whose tenants are all unchanged and rewrites one some of whose tenants
were rebuilt or removed, without them.

Stores written before parts existed have one file per tenant (``turns/<tenant>.parquet``,
``graphs/<tenant>.gt``): a tenant without a part in the manifest is its own part, and the
next build carries it over as one.

A reader pins the Lance version recorded in the manifest, so a build in progress (new
Lance versions, a new ``versions/`` directory) is never visible until ``publish`` swaps
the manifest. Tables are plain Parquet/Lance: ``polars.read_parquet(STORE/versions/v*/turns)``
or duckdb read them without memlib.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from memlib import schema
from memlib.io.checksums import GRAPH, check, tree_crcs
from memlib.io.files import (  # noqa: F401 - part_id: callers import it from here
    LZ4,
    ZSTD,
    StoreError,
    atomic_write_json,
    of_tenants,
    part_id,
    read_tenant,
    replace_parquet,
    replace_part,
    safe_name,
)
from memlib.io.lance_checks import LANCE_DATA_KEY, LANCE_FILES_KEY
from memlib.io.lance_delta import with_importance
from memlib.io.lance_tables import (  # noqa: F401 - the store's Lance names, imported from here by callers
    NODES_TABLE,
    TURN_TEXT_SCHEMA,
    TURN_TEXT_TABLE,
    LanceTables,
    connect,
    lance_shape,
    sql_str,
)
from memlib.io.parts import GRAPHS, PART_KEY, TENANT_TABLES, Carried, PartsCarrier  # noqa: F401 - TENANT_TABLES re-exported
from memlib.io.reader_checks import FILES_KEY, ReaderChecks
from memlib.io.views import VIEW_NODES, VIEWS, ViewError, view_path

MANIFEST = "manifest.json"
LATE_CACHE_SUBDIR = Path("cache") / "late"
PARQUET_TABLES = ("quarantine", *TENANT_TABLES)
GRAPHS_SCHEMA = pa.schema([pa.field("tenant_id", pa.string(), nullable=False),
                           pa.field("graph", pa.large_binary(), nullable=False)])
PART_TENANTS_KEY = "part_tenants"  # part -> every tenant its files hold rows of, live or dead (StoreReader.held)
TENANT_COUNTS_FILE = "tenant_counts.parquet"
TENANT_COUNTS_SCHEMA = pa.schema([pa.field("tenant_id", pa.string(), nullable=False),
                                  pa.field("nodes_by_kind", pa.string(), nullable=False),  # JSON object
                                  pa.field("edges_by_kind", pa.string(), nullable=False),  # JSON object
                                  pa.field("questions", pa.int64(), nullable=False)])
_VERSION_RE = re.compile(r"^v(\d{6})$")


# token_sums (float64 sums of token vectors by token id, the largest table) is read by the next
# nightly run alone: LZ4 writes it in half of zstd's time and reads it in a third, for 1.35x its bytes
PART_OPTIONS = {"token_sums": LZ4}


def version_name(n: int) -> str:
    return f"v{n:06d}"


def read_manifest(store: str | Path) -> dict[str, Any] | None:
    p = Path(store) / MANIFEST
    if not p.exists():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"{p} unreadable ({str(exc)[:120]}): publish a version again with "
                         f"`memlib build --out {store} --rollback VERSION` (manifests/ holds each one)") from None
    if not isinstance(data, dict) or not isinstance(data.get("version"), str):
        raise StoreError(f"{p} is not a memlib manifest: publish a version again with --rollback VERSION")
    return data


def _table_dir(version_dir: Path, name: str) -> Path:
    if name not in PARQUET_TABLES:
        raise StoreError(f"unknown table {name!r}; expected one of {PARQUET_TABLES}")
    return version_dir / name


def _read_parquet_dir(directory: Path, names: Iterable[str] | None, columns, schema_: pa.Schema | None):
    if names is None:
        files = sorted(directory.glob("*.parquet")) if directory.exists() else []
    else:
        files = [directory / f"{safe_name(n)}.parquet" for n in names]
        files = [f for f in files if f.exists()]
    tables = [pq.read_table(f, columns=columns) for f in files]
    if not tables:
        if schema_ is None:
            return pa.table({})
        sch = schema_ if columns is None else pa.schema([schema_.field(c) for c in columns])
        return sch.empty_table()
    return pa.concat_tables(tables, promote_options="permissive")


class StoreReader(ReaderChecks):
    """Read-only view of the published version of a store."""

    def __init__(self, path: str | Path, manifest: dict[str, Any] | None = None):
        self.path = Path(path)
        self.manifest = manifest if manifest is not None else read_manifest(self.path)
        if self.manifest is None:
            raise StoreError(f"{self.path} is not a memlib store (no {MANIFEST}); run `memlib build` first")
        self.version: str = self.manifest["version"]
        self.lance_version: int | None = self.manifest.get("lance_version")
        self.turn_text_version: int | None = self.manifest.get("lance_turn_text_version")
        self.dim: int = int(self.manifest.get("embedding_dim", schema.DEFAULT_EMBED_DIM))
        self._nodes_tbl = None
        self._turn_text_tbl = None

    @property
    def version_dir(self) -> Path:
        return self.path / "versions" / self.version

    def tenants(self) -> list[str]:
        return sorted(self.manifest.get("tenants", {}))

    def has_tenant(self, tenant: str) -> bool:
        return tenant in self.manifest.get("tenants", {})

    def tenant_counts(self) -> dict[str, dict[str, Any]]:
        """Tenant -> {"nodes_by_kind", "edges_by_kind", "questions"} of this version; empty for a
        version written before the file existed, or whose file is damaged (then the counts are
        taken from the rows: jobs/builder/counts.py)."""
        path = self.version_dir / TENANT_COUNTS_FILE
        try:
            t = pq.read_table(path, schema=TENANT_COUNTS_SCHEMA)
            rows = zip(*(t.column(c).to_pylist() for c in TENANT_COUNTS_SCHEMA.names))
            return {tenant: {"nodes_by_kind": json.loads(n), "edges_by_kind": json.loads(e), "questions": q}
                    for tenant, n, e, q in rows}
        except (OSError, ValueError, pa.ArrowException):  # missing or damaged: never trusted
            return {}

    def part_of(self, tenant: str) -> str:
        """The part holding ``tenant``'s rows (a store written before parts: the tenant's own file)."""
        entry = self.manifest.get("tenants", {}).get(tenant) or {}
        return entry.get(PART_KEY) or tenant

    def parts(self) -> dict[str, list[str]]:
        """Part -> the tenants of this version it holds."""
        out: dict[str, list[str]] = {}
        for tenant in self.tenants():
            out.setdefault(self.part_of(tenant), []).append(tenant)
        return out

    def held(self) -> dict[str, list[str]]:
        """Part -> every tenant its files hold rows of: more than :meth:`parts` names once some were
        rebuilt or removed since it was written (their rows stay, dead, until it is compacted)."""
        return {p: list(ts) for p, ts in (self.manifest.get(PART_TENANTS_KEY) or {}).items()}

    def table(self, name: str, tenant: str | None = None, columns: list[str] | None = None) -> pa.Table:
        if tenant is None:
            return self._whole_table(name, columns)
        f = _table_dir(self.version_dir, name) / f"{safe_name(self.part_of(tenant))}.parquet"
        if not f.exists():
            return _read_parquet_dir(f.parent, [], columns, schema.TABLES.get(name))
        return read_tenant(f, tenant, columns)

    def _whole_table(self, name: str, columns: list[str] | None) -> pa.Table:
        """Every live row of table ``name``: a part's dead rows (tenants rebuilt or removed since it
        was written) are left out."""
        directory = _table_dir(self.version_dir, name)
        held, live = self.held(), self.parts() if name in TENANT_TABLES else {}
        masked = {p: ts for p, ts in live.items() if len(held.get(p, ts)) > len(ts)}
        if not masked:
            return _read_parquet_dir(directory, None, columns, schema.TABLES.get(name))
        cols = None if columns is None else list(dict.fromkeys([*columns, "tenant_id"]))
        tables = []
        for f in sorted(directory.glob("*.parquet")) if directory.exists() else []:
            t = pq.read_table(f, columns=cols)
            tables.append(of_tenants(t, masked[f.stem]) if f.stem in masked else t)
        if not tables:
            return _read_parquet_dir(directory, None, columns, schema.TABLES.get(name))
        t = pa.concat_tables(tables, promote_options="permissive")
        return t if columns is None else t.select(columns)

    def view(self, name: str, tenant: str) -> pa.RecordBatch:
        """``tenant``'s view ``name`` (memlib/io/views.py: its nodes or turns, mapped, no decoding);
        :class:`~memlib.io.views.ViewError` when the version has none for it or it disagrees with the
        manifest's count of the tenant's rows (the caller reads the tables instead)."""
        entry = self.manifest.get("tenants", {}).get(tenant) or {}
        if PART_KEY not in entry:
            raise ViewError(f"tenant {tenant!r} has no part in version {self.version}")
        rows = entry.get("nodes" if name == VIEW_NODES else "turns")
        if not isinstance(rows, int):
            raise ViewError(f"the manifest of version {self.version} does not count tenant {tenant!r}'s rows")
        return VIEWS.tenant(view_path(self.version_dir, name, entry[PART_KEY]), tenant, rows)

    def view_meta(self, name: str, tenant: str) -> dict[str, Any]:
        """The JSON object the view ``name`` keeps with ``tenant``'s batch (the turns view: its
        ``matrix_ref``); :class:`~memlib.io.views.ViewError` as :meth:`view`."""
        self.view(name, tenant)  # the batch must be trusted before what it carries
        return VIEWS.meta(view_path(self.version_dir, name, self.manifest["tenants"][tenant][PART_KEY]), tenant)

    def missing_files(self, tenant: str) -> list[str]:
        """The files ``tenant``'s published data needs that are gone (its turns; its edges,
        segments and graph when the manifest counts any), as paths under the version directory."""
        entry = self.manifest.get("tenants", {}).get(tenant) or {}
        need = ["turns"] + [name for name in ("edges", "segments") if entry.get(name)]
        files = [self.table_file(name, tenant) for name in need]
        files += [self.graph_file(tenant)] if entry.get("nodes") else []
        return [str(f.relative_to(self.version_dir)) for f in files if not f.exists()]

    def table_file(self, name: str, tenant: str) -> Path:
        """The file holding ``tenant``'s rows of table ``name`` (shared with its part's other tenants)."""
        return _table_dir(self.version_dir, name) / f"{safe_name(self.part_of(tenant))}.parquet"

    def graph_file(self, tenant: str) -> Path:
        """The file holding ``tenant``'s graph: its part's graphs, or an older store's ``.gt`` file."""
        part = self.part_of(tenant)
        if part == tenant and (old := self.graph_path(tenant)).exists():
            return old
        return self.version_dir / GRAPHS / f"{safe_name(part)}.parquet"

    def graph_bytes(self, tenant: str) -> bytes | None:
        """``tenant``'s graph (graph-tool ``.gt`` bytes; memlib.graph.build.load reads them), or None
        when it has none."""
        path = self.graph_file(tenant)
        if not path.exists():
            return None
        expected = (self.manifest.get(FILES_KEY) or {}).get(path.relative_to(self.version_dir).as_posix())
        if expected is not None:  # a damaged graph is never loaded (graph-tool may read flipped bytes)
            check(path, expected, GRAPH)
        if path.suffix == ".gt":
            return path.read_bytes()
        t = read_tenant(path, tenant, ["graph"])
        return t.column("graph")[0].as_py() if t.num_rows else None

    def nodes_table(self):
        """The lancedb table pinned to the published version (for vector/FTS search)."""
        if self._nodes_tbl is None:
            tbl = connect(self.path).open_table(NODES_TABLE)
            if self.lance_version is not None:
                tbl.checkout(self.lance_version)
            self._nodes_tbl = tbl
        return self._nodes_tbl

    def turn_text_table(self):
        """The lancedb turn-text table (BM25 over turns) pinned to the published version,
        or None for stores written before it existed."""
        if self._turn_text_tbl is None and self.turn_text_version is not None:
            tbl = connect(self.path).open_table(TURN_TEXT_TABLE)
            tbl.checkout(self.turn_text_version)
            self._turn_text_tbl = tbl
        return self._turn_text_tbl

    def nodes(self, tenant: str | None = None, columns: list[str] | None = None,
              kinds: Iterable[str] | None = None) -> pa.Table:
        filters = []
        if tenant is not None:
            filters.append(f"tenant_id = {sql_str(tenant)}")
        if kinds is not None:
            filters.append("kind IN (" + ", ".join(sql_str(k) for k in kinds) + ")")
        q = self.nodes_table().search()
        if filters:
            q = q.where(" AND ".join(filters))
        wants_importance = columns is None or "importance" in columns
        if columns is not None:
            # the node id to find each row's importance by
            q = q.select(list(dict.fromkeys([*columns, "node_id"])) if wants_importance else list(columns))
        table = q.limit(None).to_arrow()
        if wants_importance:
            table = with_importance(table, self.table("node_importance", tenant, ["node_id", "importance"]))
        return table if columns is None else table.select(list(columns))

    def edges(self, tenant: str | None = None) -> pa.Table:
        return self.table("edges", tenant)

    def graph_path(self, tenant: str) -> Path:
        return self.version_dir / "graphs" / f"{safe_name(tenant)}.gt"


class StoreWriter(LanceTables, PartsCarrier):
    """Writes a new version of a store; nothing is visible to readers until :meth:`publish`."""

    def __init__(self, path: str | Path, *, dim: int = schema.DEFAULT_EMBED_DIM):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.dim = dim
        self.base = StoreReader(self.path) if read_manifest(self.path) else None
        self.number = self._next_number()
        self.version = version_name(self.number)
        self.version_dir = self.path / "versions" / self.version
        if self.version_dir.exists():  # left over from a crashed, unpublished build
            shutil.rmtree(self.version_dir)
        self.version_dir.mkdir(parents=True)

    @classmethod
    def into(cls, version_dir: str | Path) -> StoreWriter:
        """A writer of table files into an unpublished version directory that a build made (as
        its workers write their rows' parts): no new version, nothing cleared, no Lance."""
        w = cls.__new__(cls)
        w.version_dir = Path(version_dir)
        w.path, w.version, w.base, w.dim = w.version_dir.parent.parent, w.version_dir.name, None, 0
        return w

    def _next_number(self) -> int:
        nums = [0]
        for d in (self.path / "versions", self.path / "manifests"):
            if d.exists():
                for p in d.iterdir():
                    m = _VERSION_RE.fullmatch(p.stem)
                    if m:
                        nums.append(int(m.group(1)))
        if self.base is not None:
            nums.append(int(self.base.version[1:]))
        return max(nums) + 1

    def table_path(self, name: str, part: str) -> Path:
        return _table_dir(self.version_dir, name) / f"{safe_name(part)}.parquet"

    def write_table(self, name: str, part: str, table: pa.Table) -> Path:
        """Write one partition (usually a tenant) of a Parquet table, conformed to its schema."""
        table = schema.conform(table, schema.TABLES[name], name=name)
        return replace_part(table, self.table_path(name, part), PART_OPTIONS.get(name, ZSTD))

    def table(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """Every partition of table ``name`` written to this (unpublished) version so far."""
        return _read_parquet_dir(_table_dir(self.version_dir, name), None, columns, schema.TABLES.get(name))

    def write_graphs(self, part: str, graphs: dict[str, bytes]) -> Path | None:
        """Write the graphs of a part's tenants (tenant -> ``.gt`` bytes) as one file."""
        if not graphs:
            return None
        table = pa.table({"tenant_id": list(graphs), "graph": list(graphs.values())}, schema=GRAPHS_SCHEMA)
        return replace_part(table, self.version_dir / GRAPHS / f"{safe_name(part)}.parquet")

    def published(self, name: str, tenant: str, columns: list[str] | None = None) -> pa.Table | None:
        """``tenant``'s rows of table ``name`` in the published version (None: not published, or its
        file is damaged: nothing published can be kept from it)."""
        if self.base is None or tenant not in self.base.manifest.get("tenants", {}):
            return None
        try:
            return self.base.table(name, tenant, columns) if self.base.table_file(name, tenant).exists() else None
        except (OSError, pa.ArrowException):
            return None

    def graph_path(self, tenant: str) -> Path:
        """A ``.gt`` file of this version (stores written before parts; tests write them too)."""
        p = self.version_dir / "graphs" / f"{safe_name(tenant)}.gt"
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    # -- publish --------------------------------------------------------------------------
    def write_tenant_counts(self, counts: dict[str, dict[str, Any]]) -> None:
        """This version's per-tenant counts (tenant -> nodes_by_kind, edges_by_kind, questions)."""
        tenants = sorted(counts)
        table = pa.table({"tenant_id": tenants,
                          "nodes_by_kind": [json.dumps(counts[t]["nodes_by_kind"], sort_keys=True) for t in tenants],
                          "edges_by_kind": [json.dumps(counts[t]["edges_by_kind"], sort_keys=True) for t in tenants],
                          "questions": [int(counts[t]["questions"]) for t in tenants]}, schema=TENANT_COUNTS_SCHEMA)
        replace_parquet(table, self.version_dir / TENANT_COUNTS_FILE)

    def publish(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Atomically make this version the one readers see."""
        tbl = self.open_nodes()
        data = dict(manifest)
        data.update(version=self.version, lance_version=tbl.version, embedding_dim=self.dim,
                    lance_turn_text_version=self.open_turn_text().version)
        base = self.base  # every file with its checksum (memlib verify, the service, the next run's carry)
        data[FILES_KEY] = tree_crcs(self.version_dir, base and base.version_dir, base and base.manifest.get(FILES_KEY))
        data[LANCE_FILES_KEY] = self.lance_files(base and base.manifest.get(LANCE_FILES_KEY))
        data[LANCE_DATA_KEY] = self.lance_data(base and base.manifest.get(LANCE_DATA_KEY))
        atomic_write_json(self.path / "manifests" / f"{self.version}.json", data)
        atomic_write_json(self.path / MANIFEST, data)
        return data
