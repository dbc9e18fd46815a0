"""The store's Lance tables (``nodes`` and ``turn_text``): writes whose commits follow rows,
never tenants, their indexes and compaction. :class:`memlib.io.store.StoreWriter` has these."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema

NODES_TABLE = "nodes"
DELETE_CLAUSES = 256  # clauses (a chunk of whole tenants, or one tenant's rows) OR-ed in one delete
# Turn text alone, for lexical (BM25) search over turns: a full-text index over all node
# kinds mixes short facts/triplets into the corpus statistics (average document length,
# idf) and measurably hurts turn ranking (LoCoMo dev3 turn R@10: 49.1 mixed vs 63.5 here).
TURN_TEXT_TABLE = "turn_text"
TURN_TEXT_SCHEMA = pa.schema([
    pa.field("node_id", pa.string(), nullable=False),
    pa.field("tenant_id", pa.string(), nullable=False),
    pa.field("text", pa.string(), nullable=False),
])


def sql_str(value: str) -> str:
    """A SQL string literal for Lance filters."""
    return "'" + str(value).replace("'", "''") + "'"


def connect(store: Path):
    return import_lancedb().connect(str(store / "lance"))


# lance_namespace's REST client: lancedb's import runs its package body (nine API modules, each
# method wrapped by pydantic at import: about 0.5 CPU-s, half of lancedb's import) and a store on
# a file system never calls it
REST_CLIENT = "lance_namespace_urllib3_client"


def import_lancedb() -> Any:
    """lancedb, imported lazily (its start-up is not free) and without running the REST client's
    package body when that body is only its own imports (:mod:`memlib.io.deferred_package`): its
    ``models`` subpackage, which lance_namespace imports, loads alone, and the body runs when a
    name of it is first asked for. Any other layout: a plain import."""
    import importlib
    import sys

    if "lancedb" not in sys.modules:
        from memlib.io.deferred_package import defer_body

        defer_body(REST_CLIENT)
    return importlib.import_module("lancedb")


class LanceTables:
    """The Lance half of a store writer (``self.path``: the store, ``self.dim``: its vector size)."""

    path: Path
    dim: int

    @property
    def nodes_uri(self) -> str:
        return str(self.path / "lance" / f"{NODES_TABLE}.lance")

    def open_nodes(self):
        db = connect(self.path)
        if NODES_TABLE in db.list_tables().tables:
            return db.open_table(NODES_TABLE)
        return db.create_table(NODES_TABLE, schema=schema.nodes_schema(self.dim))

    def open_turn_text(self):
        db = connect(self.path)
        if TURN_TEXT_TABLE in db.list_tables().tables:
            return db.open_table(TURN_TEXT_TABLE)
        return db.create_table(TURN_TEXT_TABLE, schema=TURN_TEXT_SCHEMA)

    def replace_tenant_nodes(self, tenants: Iterable[str], nodes: pa.Table | None) -> int:
        """Delete these tenants' nodes and add ``nodes``; the turn-text table follows. Returns the
        nodes table version. For many tenants use :meth:`write_tenants`: this is commits per call."""
        return self.write_tenants(tenants, [] if nodes is None else [nodes])

    def write_tenants(self, remove: Iterable[str], parts: Iterable[pa.Table], *,
                      rows_per_commit: int = 250_000, tenants_per_delete: int = 20_000,
                      remove_rows: Mapping[str, list[str]] | None = None) -> int:
        """Replace tenants' nodes in both Lance tables with a number of commits that follows rows,
        not tenants: one delete of every tenant in ``remove`` (the rebuilt and the removed ones, in
        chunks of ``tenants_per_delete``), then ``parts`` (each a tenant's nodes, or several
        tenants') added in batches of about ``rows_per_commit`` rows, one commit and one fragment
        per batch. Every commit rewrites a manifest listing every fragment, so commits per tenant
        made a run quadratic in tenants. ``remove_rows``: tenant -> node ids, rows of tenants
        not in ``remove`` deleted one by one (a tenant whose other rows stay as published; its
        part then holds only its changed and new rows). Readers pin the published version, so no
        partial state is visible. Returns the nodes table version."""
        tbl, turn_tbl = self.open_nodes(), self.open_turn_text()
        remove = sorted(set(remove))
        clauses = ["tenant_id IN (" + ", ".join(sql_str(t) for t in remove[i:i + tenants_per_delete]) + ")"
                   for i in range(0, len(remove), tenants_per_delete)]
        clauses += [f"(tenant_id = {sql_str(t)} AND node_id IN ({', '.join(sql_str(n) for n in ids)}))"
                    for t, ids in sorted((remove_rows or {}).items()) if ids and t not in remove]
        node_schema = schema.nodes_schema(self.dim)
        buf: list[pa.Table] = []
        rows = 0
        # the two tables' commits are independent: the turn-text table's run on another thread (Lance
        # writes without the GIL), each delete or add beside the nodes table's
        with ThreadPoolExecutor(1, thread_name_prefix="memlib-lance") as pool:
            for i in range(0, len(clauses), DELETE_CLAUSES):
                where = " OR ".join(clauses[i:i + DELETE_CLAUSES])
                turn_deleted = pool.submit(turn_tbl.delete, where)
                tbl.delete(where)
                turn_deleted.result()

            def flush() -> None:
                nonlocal buf, rows
                if not rows:
                    return
                nodes = pa.concat_tables(buf)
                turns = nodes.filter(pc.equal(nodes.column("kind"), "turn"))
                turns_added = pool.submit(turn_tbl.add, turns.select(TURN_TEXT_SCHEMA.names).cast(TURN_TEXT_SCHEMA)) \
                    if turns.num_rows else None
                tbl.add(nodes)
                if turns_added is not None:
                    turns_added.result()
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
        (docs/decisions/0003-vector-index.md). Below ``min_rows_for_ann`` rows it is skipped anyway; its
        partitions grow with the table (about sqrt(n)).

        ``incremental`` (a nightly run over a store whose indexes exist): searches already see
        rows added since the last indexing (Lance scans unindexed rows exactly, same scores),
        so the full-text index is left until more than ``merge_rows`` rows (or a quarter of the
        table) are unindexed; then they are merged into the existing indexes (Lance ``optimize``:
        compaction and index merge, no old version pruned, so rollback keeps working). A nightly
        run's cost follows what changed; the merge, whose cost follows the table, comes every
        many nights. The bitmap indexes (tenant, kind) are rebuilt on every run that added rows:
        a tenant's rows are read through them, and a scan of the unindexed rows is not cheap
        (at 10,000 tenants, 41,206 unindexed rows made one tenant's nodes 74-87 ms to read;
        rebuilding the bitmaps of 320,324 rows took 0.2 s, docs/decisions/0026-many-tenant-layout.md).

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
                self._rebuild_bitmaps()
                return self.open_nodes().version
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

    def _rebuild_bitmaps(self) -> None:
        """Rebuild the tenant and kind bitmap indexes of a table some of whose rows they do not
        cover (a new Lance version per index; nothing when every row is covered)."""
        from lancedb.index import Bitmap

        for tbl, columns in ((self.open_nodes(), ("tenant_id", "kind")), (self.open_turn_text(), ("tenant_id",))):
            stale = {c for i in tbl.list_indices() if int(i.num_unindexed_rows or 0) for c in i.columns}
            for column in columns:
                if column in stale:
                    tbl.create_index(column, config=Bitmap(), replace=True)

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

    def lance_files(self, known: Mapping[str, list[int]] | None = None) -> dict[str, list[int]]:
        """``[size, crc32]`` of the manifest and index files of both tables' newest versions, by path
        under ``lance/`` (the manifest's ``lance_files``); those ``known`` lists are not hashed again
        (memlib/io/lance_checks.py)."""
        from memlib.io.lance_checks import files_crcs, version_files

        lance_dir = self.path / "lance"
        files = [f for tbl, name in ((self.open_nodes(), NODES_TABLE), (self.open_turn_text(), TURN_TEXT_TABLE))
                 for f in version_files(tbl, lance_dir / f"{name}.lance")]
        return files_crcs(lance_dir, files, dict(known or {}))

    def lance_data(self, known: Mapping[str, list[int]] | None = None) -> dict[str, list[int]]:
        """``[size, crc32, mtime_ns]`` of every data and deletion file of both tables (the manifest's
        ``lance_data``); those ``known`` lists are not hashed again: a run hashes the files it wrote."""
        from memlib.io.lance_checks import data_files, files_crcs

        lance_dir = self.path / "lance"
        files = [f for name in (NODES_TABLE, TURN_TEXT_TABLE) for f in data_files(lance_dir / f"{name}.lance")]
        return files_crcs(lance_dir, files, dict(known or {}))

    def lance_tables(self) -> dict[str, Any]:
        """Manifest key -> open lancedb table, for every Lance table of the store."""
        return {"lance_version": self.open_nodes(), "lance_turn_text_version": self.open_turn_text()}

    def start_new_space(self) -> None:
        """Empty the Lance tables with this writer's schema (a new Lance version each): for a full
        build in another vector space, whose vectors cannot join the published ones. The published
        versions stay readable, and a rollback restores them."""
        db = connect(self.path)
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


def _fragments(tbl) -> int:
    return int(tbl.stats()["fragment_stats"]["num_fragments"])


def lance_shape(store: str | Path) -> dict[str, dict[str, int]]:
    """Data fragments and versions of each Lance table of a store, at its newest version."""
    db = connect(Path(store))
    names = set(db.list_tables().tables)
    return {name: {"fragments": _fragments(t), "versions": len(t.list_versions())}
            for name in (NODES_TABLE, TURN_TEXT_TABLE) if name in names for t in [db.open_table(name)]}
