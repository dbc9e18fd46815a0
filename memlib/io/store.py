"""The memory store on disk: versioned Parquet tables, one Lance ``nodes`` table, graphs,
and an atomically swapped ``manifest.json``.

Layout of a store directory::

    STORE/
      manifest.json                 the published version (atomic swap; readers start here)
      manifests/v000003.json        every published manifest, for rollback
      lance/nodes.lance             all tenants' nodes (vector + full-text + tenant index)
      versions/v000003/
        turns/<part>.parquet        a part holds whole tenants: the tenants built together in one
        segments/<part>.parquet     row of the build (small tenants travel together) or carried
        edges/<part>.parquet        together; the manifest names each tenant's part. A nightly run
        questions/<part>.parquet    hard-links a part whose tenants are all unchanged (one link per
        node_fallbacks/<part>.parquet   file, not per tenant) and rewrites a part some of whose
        token_sums/<part>.parquet       tenants were rebuilt or removed, without them
        llm_calls/<part>.parquet
        graphs/<part>.parquet       tenant_id, graph: each tenant's graph-tool ``.gt`` bytes
        quarantine/<name>.parquet
      cache/llm/                    LLM responses (see memlib/llm/cache.py)
      cache/late/                   auto's token matrices, keyed by the turns they encode

Stores written before parts existed have one file per tenant (``turns/<tenant>.parquet``,
``graphs/<tenant>.gt``): a tenant without a part in the manifest is its own part, and the
next build carries it over as one.

A reader pins the Lance version recorded in the manifest, so a build in progress (new
Lance versions, a new ``versions/`` directory) is never visible until ``publish`` swaps
the manifest. Tables are plain Parquet/Lance: ``polars.read_parquet(STORE/versions/v*/turns)``
or duckdb read them without memlib.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memlib import schema

MANIFEST = "manifest.json"
NODES_TABLE = "nodes"
LATE_CACHE_SUBDIR = Path("cache") / "late"
# Turn text alone, for lexical (BM25) search over turns: a full-text index over all node
# kinds mixes short facts/triplets into the corpus statistics (average document length,
# idf) and measurably hurts turn ranking (LoCoMo dev3 turn R@10: 49.1 mixed vs 63.5 here).
TURN_TEXT_TABLE = "turn_text"
TURN_TEXT_SCHEMA = pa.schema([
    pa.field("node_id", pa.string(), nullable=False),
    pa.field("tenant_id", pa.string(), nullable=False),
    pa.field("text", pa.string(), nullable=False),
])
PARQUET_TABLES = ("turns", "segments", "edges", "questions", "quarantine", "llm_calls", "node_fallbacks",
                  "token_sums")
# the tables whose parts hold whole tenants (quarantine is one partition per input file)
TENANT_TABLES = tuple(t for t in PARQUET_TABLES if t != "quarantine")
GRAPHS = "graphs"
GRAPHS_SCHEMA = pa.schema([pa.field("tenant_id", pa.string(), nullable=False),
                           pa.field("graph", pa.large_binary(), nullable=False)])
PART_KEY = "part"  # a tenant's entry in the manifest names its part
_VERSION_RE = re.compile(r"^v(\d{6})$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class StoreError(RuntimeError):
    pass


def version_name(n: int) -> str:
    return f"v{n:06d}"


def sql_str(value: str) -> str:
    """A SQL string literal for Lance filters."""
    return "'" + str(value).replace("'", "''") + "'"


def _safe(name: str) -> str:
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


def part_id(tenants: Iterable[str], salt: str) -> str:
    """The name of the part holding ``tenants`` (a content hash: a retried row names the same part)."""
    h = hashlib.sha256(salt.encode("utf-8"))
    for t in sorted(tenants):
        h.update(b"\n" + t.encode("utf-8"))
    return f"part-{h.hexdigest()[:20]}"


def _of_tenants(table: pa.Table, tenants: Iterable[str]) -> pa.Table:
    return table.filter(pc.is_in(table.column("tenant_id"), value_set=pa.array(sorted(set(tenants)), pa.string())))


def _connect(store: Path):
    import lancedb  # imported lazily: lancedb start-up is not free

    return lancedb.connect(str(store / "lance"))


def _table_dir(version_dir: Path, name: str) -> Path:
    if name not in PARQUET_TABLES:
        raise StoreError(f"unknown table {name!r}; expected one of {PARQUET_TABLES}")
    return version_dir / name


def _read_parquet_dir(directory: Path, names: Iterable[str] | None, columns, schema_: pa.Schema | None):
    if names is None:
        files = sorted(directory.glob("*.parquet")) if directory.exists() else []
    else:
        files = [directory / f"{_safe(n)}.parquet" for n in names]
        files = [f for f in files if f.exists()]
    tables = [pq.read_table(f, columns=columns) for f in files]
    if not tables:
        if schema_ is None:
            return pa.table({})
        sch = schema_ if columns is None else pa.schema([schema_.field(c) for c in columns])
        return sch.empty_table()
    return pa.concat_tables(tables, promote_options="permissive")


class StoreReader:
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

    def table(self, name: str, tenant: str | None = None, columns: list[str] | None = None) -> pa.Table:
        if tenant is None:
            return _read_parquet_dir(_table_dir(self.version_dir, name), None, columns, schema.TABLES.get(name))
        part = self.part_of(tenant)
        if part == tenant:
            return _read_parquet_dir(_table_dir(self.version_dir, name), [tenant], columns, schema.TABLES.get(name))
        cols = None if columns is None else list(dict.fromkeys([*columns, "tenant_id"]))
        t = _read_parquet_dir(_table_dir(self.version_dir, name), [part], cols, schema.TABLES.get(name))
        t = _of_tenants(t, [tenant]) if t.num_rows else t
        return t if columns is None else t.select(columns)

    def table_file(self, name: str, tenant: str) -> Path:
        """The file holding ``tenant``'s rows of table ``name`` (shared with its part's other tenants)."""
        return _table_dir(self.version_dir, name) / f"{_safe(self.part_of(tenant))}.parquet"

    def graph_file(self, tenant: str) -> Path:
        """The file holding ``tenant``'s graph: its part's graphs, or an older store's ``.gt`` file."""
        part = self.part_of(tenant)
        if part == tenant and (old := self.graph_path(tenant)).exists():
            return old
        return self.version_dir / GRAPHS / f"{_safe(part)}.parquet"

    def graph_bytes(self, tenant: str) -> bytes | None:
        """``tenant``'s graph (graph-tool ``.gt`` bytes; memlib.graph.build.load reads them), or None
        when it has none."""
        path = self.graph_file(tenant)
        if not path.exists():
            return None
        if path.suffix == ".gt":
            return path.read_bytes()
        t = pq.read_table(path)
        t = _of_tenants(t, [tenant])
        return t.column("graph")[0].as_py() if t.num_rows else None

    def nodes_table(self):
        """The lancedb table pinned to the published version (for vector/FTS search)."""
        if self._nodes_tbl is None:
            tbl = _connect(self.path).open_table(NODES_TABLE)
            if self.lance_version is not None:
                tbl.checkout(self.lance_version)
            self._nodes_tbl = tbl
        return self._nodes_tbl

    def turn_text_table(self):
        """The lancedb turn-text table (BM25 over turns) pinned to the published version,
        or None for stores written before it existed."""
        if self._turn_text_tbl is None and self.turn_text_version is not None:
            tbl = _connect(self.path).open_table(TURN_TEXT_TABLE)
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
        if columns is not None:
            q = q.select(list(columns))
        return q.limit(None).to_arrow()

    def edges(self, tenant: str | None = None) -> pa.Table:
        return self.table("edges", tenant)

    def graph_path(self, tenant: str) -> Path:
        return self.version_dir / "graphs" / f"{_safe(tenant)}.gt"


class StoreWriter:
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
        return _table_dir(self.version_dir, name) / f"{_safe(part)}.parquet"

    def write_table(self, name: str, part: str, table: pa.Table) -> Path:
        """Write one partition (usually a tenant) of a Parquet table, conformed to its schema."""
        table = schema.conform(table, schema.TABLES[name], name=name)
        out = self.table_path(name, part)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, out)
        return out

    def table(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """Every partition of table ``name`` written to this (unpublished) version so far."""
        return _read_parquet_dir(_table_dir(self.version_dir, name), None, columns, schema.TABLES.get(name))

    def write_graphs(self, part: str, graphs: dict[str, bytes]) -> Path | None:
        """Write the graphs of a part's tenants (tenant -> ``.gt`` bytes) as one file."""
        if not graphs:
            return None
        table = pa.table({"tenant_id": list(graphs), "graph": list(graphs.values())}, schema=GRAPHS_SCHEMA)
        out = self.version_dir / GRAPHS / f"{_safe(part)}.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, out)
        return out

    def published(self, name: str, tenant: str, columns: list[str] | None = None) -> pa.Table | None:
        """``tenant``'s rows of table ``name`` in the published version (None: not published)."""
        if self.base is None or tenant not in self.base.manifest.get("tenants", {}):
            return None
        if not self.base.table_file(name, tenant).exists():
            return None
        return self.base.table(name, tenant, columns)

    def carry_over(self, tenants: Iterable[str], *, part_turns: int = 512) -> dict[str, str]:
        """Bring unchanged published tenants into this version without recomputing them; returns
        tenant -> its part in this version. A part all of whose tenants are carried is hard-linked
        (one link per file, whatever its number of tenants); the carried tenants of parts that
        also held rebuilt or removed ones are rewritten together into new parts of about
        ``part_turns`` turns, so parts neither hold stale rows nor shrink without end."""
        if self.base is None:
            raise StoreError("cannot carry over tenants: the store has no published version")
        carried, out = set(tenants), {}
        remnants: list[str] = []
        for part, members in self.base.parts().items():
            keep = [t for t in members if t in carried]
            if len(keep) == len(members):
                self._link_part(part)
                out.update((t, part) for t in keep)
            else:
                remnants += keep
        info = self.base.manifest.get("tenants", {})
        group: list[str] = []
        turns = 0
        for tenant in remnants + [""]:  # "" flushes the last group
            n = int((info.get(tenant) or {}).get("turns") or 0)
            if group and (not tenant or turns + n > part_turns):
                out.update(self._rewrite_part(group))
                group, turns = [], 0
            if tenant:
                group.append(tenant)
                turns += n
        return out

    def prune_parts(self, parts: dict[str, str], check: Iterable[str] = ()) -> None:
        """Make this version's files hold exactly the tenants of ``parts`` (tenant -> part): files of
        parts no tenant is in are removed (left by an interrupted run whose tenants were then
        rebuilt), and the parts named in ``check`` (a resumed run's) lose rows of other tenants."""
        members: dict[str, list[str]] = {}
        for tenant, part in parts.items():
            members.setdefault(part, []).append(tenant)
        for name in (*TENANT_TABLES, GRAPHS):
            d = self.version_dir / name
            for f in sorted(d.iterdir()) if d.is_dir() else []:
                if f.suffix not in (".parquet", ".gt"):
                    continue
                if f.stem not in members:
                    f.unlink()
                elif f.stem in check and f.suffix == ".parquet":
                    t = pq.read_table(f)
                    kept = _of_tenants(t, members[f.stem])
                    if kept.num_rows != t.num_rows:
                        tmp = f.with_suffix(".parquet.tmp")
                        pq.write_table(kept, tmp, compression="zstd")
                        os.replace(tmp, f)

    def _link_part(self, part: str) -> None:
        base = self.base.version_dir
        for name in (*TENANT_TABLES, GRAPHS):
            src = base / name / f"{_safe(part)}.parquet"
            if src.exists():
                dst = self.version_dir / name / src.name
                dst.parent.mkdir(parents=True, exist_ok=True)
                _link_or_copy(src, dst)
        old = self.base.graph_path(part)  # a store written before parts: the tenant's own .gt
        if old.exists():
            _link_or_copy(old, self.graph_path(part))

    def _rewrite_part(self, tenants: list[str]) -> dict[str, str]:
        """Copy ``tenants``' rows from their published parts into one new part of this version."""
        new = part_id(tenants, f"{self.version}/carried")
        sources = sorted({self.base.part_of(t) for t in tenants})
        for name in (*TENANT_TABLES, GRAPHS):
            d = self.base.version_dir / name
            tables = [_of_tenants(pq.read_table(f), tenants) for p in sources if (f := d / f"{p}.parquet").exists()]
            tables = [t for t in tables if t.num_rows]
            if not tables:
                continue
            table = pa.concat_tables(tables, promote_options="permissive")
            if name == GRAPHS:
                self.write_graphs(new, dict(zip(table.column("tenant_id").to_pylist(),
                                                table.column("graph").to_pylist())))
            else:
                self.write_table(name, new, table)
        return {t: new for t in tenants}

    def graph_path(self, tenant: str) -> Path:
        """A ``.gt`` file of this version (stores written before parts; tests write them too)."""
        p = self.version_dir / "graphs" / f"{_safe(tenant)}.gt"
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    # -- Lance nodes ----------------------------------------------------------------------
    @property
    def nodes_uri(self) -> str:
        return str(self.path / "lance" / f"{NODES_TABLE}.lance")

    def open_nodes(self):
        db = _connect(self.path)
        if NODES_TABLE in db.list_tables().tables:
            return db.open_table(NODES_TABLE)
        return db.create_table(NODES_TABLE, schema=schema.nodes_schema(self.dim))

    def open_turn_text(self):
        db = _connect(self.path)
        if TURN_TEXT_TABLE in db.list_tables().tables:
            return db.open_table(TURN_TEXT_TABLE)
        return db.create_table(TURN_TEXT_TABLE, schema=TURN_TEXT_SCHEMA)

    def replace_tenant_nodes(self, tenants: Iterable[str], nodes: pa.Table | None) -> int:
        """Delete these tenants' nodes and add ``nodes``; the turn-text table follows. Returns the
        nodes table version. For many tenants use :meth:`write_tenants`: this is commits per call."""
        return self.write_tenants(tenants, [] if nodes is None else [nodes])

    def write_tenants(self, remove: Iterable[str], parts: Iterable[pa.Table], *,
                      rows_per_commit: int = 250_000, tenants_per_delete: int = 20_000) -> int:
        """Replace tenants' nodes in both Lance tables with a number of commits that follows rows,
        not tenants: one delete of every tenant in ``remove`` (the rebuilt and the removed ones, in
        chunks of ``tenants_per_delete``), then ``parts`` (each a tenant's nodes, or several
        tenants') added in batches of about ``rows_per_commit`` rows, one commit and one fragment
        per batch. Every commit rewrites a manifest listing every fragment, so commits per tenant
        made a run quadratic in tenants. Readers pin the published version, so no partial state
        is visible. Returns the nodes table version."""
        tbl, turn_tbl = self.open_nodes(), self.open_turn_text()
        remove = sorted(set(remove))
        for i in range(0, len(remove), tenants_per_delete):
            where = "tenant_id IN (" + ", ".join(sql_str(t) for t in remove[i:i + tenants_per_delete]) + ")"
            tbl.delete(where)
            turn_tbl.delete(where)
        node_schema = schema.nodes_schema(self.dim)
        buf: list[pa.Table] = []
        rows = 0

        def flush() -> None:
            nonlocal buf, rows
            if not rows:
                return
            nodes = pa.concat_tables(buf)
            tbl.add(nodes)
            turns = nodes.filter(pc.equal(nodes.column("kind"), "turn"))
            if turns.num_rows:
                turn_tbl.add(turns.select(TURN_TEXT_SCHEMA.names).cast(TURN_TEXT_SCHEMA))
            buf, rows = [], 0

        for part in parts:
            if part is None or not part.num_rows:
                continue
            buf.append(schema.conform(part, node_schema, name="nodes"))
            rows += part.num_rows
            if rows >= rows_per_commit:
                flush()
        flush()
        return tbl.version

    def fragment_counts(self) -> dict[str, int]:
        """Data fragments of each Lance table at its newest version."""
        return {name: _fragments(t) for name, t in ((NODES_TABLE, self.open_nodes()),
                                                     (TURN_TEXT_TABLE, self.open_turn_text()))}

    def index_nodes(self, *, min_rows_for_ann: int = 5_000, incremental: bool = False,
                    merge_rows: int = 50_000, vector_index: bool = False, max_fragments: int = 64) -> int:
        """(Re)build the full-text and tenant/kind indexes, and with ``vector_index`` an IVF_FLAT
        index on the node vectors; returns the Lance version.

        The vector index is off by default: every memlib search is filtered to one tenant,
        and a flat scan of that tenant's rows (found through the tenant bitmap) is exact and
        fast, while a table-wide IVF index searched with that filter missed 9 % of the exact
        top 10 on longmemeval_s_dev24 and cost more CPU than the rest of the indexing together
        (docs/benchmarks.md). Below ``min_rows_for_ann`` rows it is skipped anyway; its
        partitions grow with the table (about sqrt(n)).

        ``incremental`` (a nightly run over a store whose indexes exist): searches already see
        rows added since the last indexing (Lance scans unindexed rows exactly, same scores),
        so nothing is done until more than ``merge_rows`` rows (or a quarter of the table) are
        unindexed; then they are merged into the existing indexes (Lance ``optimize``: compaction
        and index merge, no old version pruned, so rollback keeps working). A nightly run's cost
        follows what changed; the merge, whose cost follows the table, comes every many nights.

        A table holding more than ``max_fragments`` data fragments (each run adds at least one) is
        compacted first, old versions kept: fragments stay bounded after any number of runs."""
        tbl = self.open_nodes()
        n = tbl.count_rows()
        if n == 0:
            return tbl.version
        ann = vector_index and n >= min_rows_for_ann
        crowded = max(self.fragment_counts().values()) > max_fragments
        if incremental and self._indexed(tbl, ann):
            if self.unindexed_rows() <= max(merge_rows, n // 4) and not crowded:
                return tbl.version
            self._optimize()
            return self.open_nodes().version
        if crowded:
            self._optimize()
        from lancedb.index import FTS, Bitmap, IvfFlat

        tbl.create_index("text", config=FTS(with_position=False, stem=True, remove_stop_words=False),
                         replace=True)
        tbl.create_index("tenant_id", config=Bitmap(), replace=True)
        turn_tbl = self.open_turn_text()
        if turn_tbl.count_rows():
            # English stemming and stop-word removal: the BM25 configuration that measured best
            turn_tbl.create_index("text", config=FTS(with_position=False, stem=True, remove_stop_words=True),
                                  replace=True)
            turn_tbl.create_index("tenant_id", config=Bitmap(), replace=True)
        tbl.create_index("kind", config=Bitmap(), replace=True)
        if ann:
            parts = max(8, int(n ** 0.5))
            tbl.create_index("embedding", config=IvfFlat(distance_type="cosine", num_partitions=parts),
                             replace=True)
        return tbl.version

    def _optimize(self) -> None:
        """Compact both Lance tables and merge new rows into their indexes; no old version is
        pruned, so every published version stays readable and rollback keeps working."""
        keep_versions = timedelta(days=36_500)
        for tbl in self.lance_tables().values():
            tbl.optimize(cleanup_older_than=keep_versions)

    def unindexed_rows(self) -> int:
        """Rows of either Lance table that some index of it does not cover yet."""
        return max([0] + [int(i.num_unindexed_rows or 0) for t in self.lance_tables().values()
                          for i in t.list_indices()])

    def _indexed(self, tbl, ann: bool) -> bool:
        """Whether every index :meth:`index_nodes` makes already exists on both tables."""
        names = {c for i in tbl.list_indices() for c in i.columns}
        want = {"text", "tenant_id", "kind"} | ({"embedding"} if ann else set())
        turn_tbl = self.open_turn_text()
        turn_names = {c for i in turn_tbl.list_indices() for c in i.columns}
        return want <= names and (turn_tbl.count_rows() == 0 or {"text", "tenant_id"} <= turn_names)

    def lance_tables(self) -> dict[str, Any]:
        """Manifest key -> open lancedb table, for every Lance table of the store."""
        return {"lance_version": self.open_nodes(), "lance_turn_text_version": self.open_turn_text()}

    def start_new_space(self) -> None:
        """Empty the Lance tables with this writer's schema (a new Lance version each): for a full
        build in another vector space, whose vectors cannot join the published ones. The published
        versions stay readable, and a rollback restores them."""
        db = _connect(self.path)
        db.create_table(NODES_TABLE, schema=schema.nodes_schema(self.dim), mode="overwrite")
        db.create_table(TURN_TEXT_TABLE, schema=TURN_TEXT_SCHEMA, mode="overwrite")

    def restore_published(self, manifest: dict[str, Any] | None) -> None:
        """Make the newest Lance versions equal the published ones (after a rollback or a
        crashed, unpublished build)."""
        if not manifest:
            return
        for key, tbl in self.lance_tables().items():
            want = manifest.get(key)
            if want is not None and tbl.version != want:
                tbl.restore(want)

    # -- publish --------------------------------------------------------------------------
    def publish(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Atomically make this version the one readers see."""
        tbl = self.open_nodes()
        data = dict(manifest)
        data.update(version=self.version, lance_version=tbl.version, embedding_dim=self.dim,
                    lance_turn_text_version=self.open_turn_text().version)
        atomic_write_json(self.path / "manifests" / f"{self.version}.json", data)
        atomic_write_json(self.path / MANIFEST, data)
        return data


def _fragments(tbl) -> int:
    return int(tbl.stats()["fragment_stats"]["num_fragments"])


def lance_shape(store: str | Path) -> dict[str, dict[str, int]]:
    """Data fragments and versions of each Lance table of a store, at its newest version."""
    db = _connect(Path(store))
    names = set(db.list_tables().tables)
    return {name: {"fragments": _fragments(t), "versions": len(t.list_versions())}
            for name in (NODES_TABLE, TURN_TEXT_TABLE) if name in names for t in [db.open_table(name)]}


def _link_or_copy(src: Path, dst: Path) -> None:
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
