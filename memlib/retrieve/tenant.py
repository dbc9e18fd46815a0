"""Everything a strategy needs for one tenant, loaded once and cached.

:class:`TenantIndex` holds the tenant's nodes as columns (ids, kinds, texts, times,
provenance, an L2-normalized embedding matrix), the turn map (turn node id -> source
turn id, session, time, text), the pinned lancedb table, the query embedder and a lazily
loaded graph. :class:`TenantCache` keeps the most recently used tenants of one published
store version, bounded by the bytes they hold; a server replica holds one and calls
:meth:`TenantCache.refresh` to pick up a newly published version, which keeps loaded every
tenant no version in between rebuilt.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from datetime import datetime
from typing import Any, Callable, Hashable, Iterable, NamedTuple, Protocol, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib.io.memory_view import embedding_matrix
from memlib.io.store import StoreReader, sql_str
from memlib.io.views import VIEW_NODES, VIEW_TURNS, ViewError
from memlib.lazy import cached_property
from memlib.retrieve.sizes import approx_bytes

log = logging.getLogger("memlib.serve")
NODE_COLUMNS = ["node_id", "kind", "text", "time", "session_id", "provenance", "attributes",
                "importance", "embedding"]
T = TypeVar("T")
TURN_COLUMNS = ["node_id", "turn_id", "session_id", "session_index", "session_time", "turn_index",
                "speaker", "role", "text"]


class QueryEmbedder(Protocol):
    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        ...


class CachedQueryEmbedder:
    """Memoizes query vectors; :meth:`prime` embeds many queries ahead of their searches
    (evaluation embeds all questions up front, so per-query latency measures retrieval).

    Every query is embedded on its own, as the service embeds the one query of a request: a
    dynamically quantized encoder (the int8 MiniLM) quantizes each batch tensor as a whole, so in
    a batch a query's vector would depend on its batch-mates, and an evaluation would score
    vectors the service never computes (``gaama`` LoCoMo turn R@10 65.4 with batches of 32
    against 66.0 one by one, docs/decisions/0004-one-by-one-encoding.md)."""

    def __init__(self, inner: QueryEmbedder, max_items: int = 100_000):
        self.inner = inner
        self.max_items = max_items
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def prime(self, texts: Sequence[str]) -> float:
        """Embed the not-yet-cached texts, each on its own; returns the seconds it took."""
        import time

        todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
        t0 = time.perf_counter()
        workers = min(len(todo), max(1, int(getattr(self.inner, "query_concurrency", 1)))) if len(todo) > 1 else 1
        if workers > 1:  # a remote endpoint: one request per query, several in flight
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(workers, thread_name_prefix="memlib-query") as pool:
                vecs = list(pool.map(self._one, todo))
        else:
            vecs = [self._one(text) for text in todo]
        with self._lock:
            self._cache.update(zip(todo, vecs))
        return time.perf_counter() - t0

    def _one(self, text: str) -> np.ndarray:
        return np.asarray(self.inner.embed_queries([text]), dtype=np.float32)[0]

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.prime(texts)
        with self._lock:
            out = np.stack([self._cache[t] for t in texts])
            while len(self._cache) > self.max_items:
                self._cache.popitem(last=False)
        return out


class TurnInfo(NamedTuple):
    """A turn of the tenant's turn map (a named tuple: built for every turn of a tenant it opens,
    about 5x faster than a frozen dataclass, and untracked by the garbage collector once seen)."""
    node_id: str
    turn_id: str
    session_id: str
    time: datetime | None
    text: str
    speaker: str | None
    role: str | None = None


class _column(cached_property):  # noqa: N801 - used as a decorator, like cached_property
    """A lazily made attribute of :class:`TenantIndex` (a node column as Python objects, a map
    derived from one): computed on first read, then kept and its bytes counted in
    :attr:`TenantIndex.nbytes`. A cold ``auto`` query reads few of them, and making every column
    took a LoCoMo tenant's open 4 ms (docs/decisions/0028-tenant-views.md)."""

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = super().__get__(obj, owner)
        obj._column_bytes[self.attrname] = approx_bytes(value)
        return value


def _repeated_pylist(col: pa.Array | pa.ChunkedArray) -> list[Any]:
    """``col.to_pylist()``, each distinct value converted once: a tenant's turns share a few
    session times, and Arrow makes a datetime in ~3 us."""
    if len(col) == 0:
        return []
    enc = pc.dictionary_encode(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    values = enc.dictionary.to_pylist()
    return [None if i is None else values[i] for i in enc.indices.to_pylist()]


class TenantIndex:
    """One tenant's retrieval view over a pinned store version."""

    counted_apart = True  # a value that refers to its tenant view does not count the view
    def __init__(self, reader: StoreReader, tenant: str, embedder: QueryEmbedder | None = None):
        if not reader.has_tenant(tenant):
            raise KeyError(f"unknown tenant {tenant!r} in store {reader.path} "
                           f"(version {reader.version}); known: {', '.join(reader.tenants()[:20])}")
        self.reader = reader
        self.tenant = tenant
        self.embedder = embedder
        self._lock = threading.Lock()
        self._memo: dict[Hashable, Any] = {}
        self._building: dict[Hashable, threading.Lock] = {}
        self._memo_guard = threading.Lock()
        self._sizes: dict[Hashable, int] = {}  # bytes of each memoized value
        self._column_bytes: dict[str, int] = {}  # bytes of each node column made into Python objects
        start = time.perf_counter()
        self._load_nodes()
        self._load_turns()
        self.load_s = time.perf_counter() - start  # what opening the tenant took
        self._base_bytes = approx_bytes([None if self.view_used else self._nodes, self.__dict__.get("embeddings"),
                                         self.turns, self.turn_order])

    @property
    def nbytes(self) -> int:
        """Bytes this tenant view holds: its columns and turn map, what its strategies memoized,
        its graph once loaded."""
        data = self.__dict__.get("graph_data")
        if "graph" in self.__dict__ and "_graph_bytes" not in self.__dict__:
            self._graph_bytes = approx_bytes(self.__dict__["graph"])
        memo = sum(list(self._sizes.values()))  # a copy: strategies may memoize meanwhile
        columns = sum(list(self._column_bytes.values()))
        return (self._base_bytes + memo + columns + (len(data) if data is not None else 0)
                + self.__dict__.get("_graph_bytes", 0) + self.__dict__.get("_embedding_bytes", 0))

    def rebound(self, reader: StoreReader) -> "TenantIndex":
        """This view over another store version in which the tenant's data is the same (a
        version that carried it): everything loaded and memoized is shared, and queries read
        the other version's tables. Queries running on this view keep its version."""
        twin = object.__new__(TenantIndex)
        twin.__dict__.update(self.__dict__)
        twin._column_bytes = dict(self._column_bytes)
        twin.reader = reader
        return twin

    # -- derived data, built once per tenant view ---------------------------------------
    def memo(self, key: Hashable, build: Callable[[], T]) -> T:
        """``build()``'s result for ``key``, computed once for this tenant view and kept with it
        (so it goes when a new store version replaces the view). Single flight: concurrent first
        callers of one key wait for one build instead of each building; other keys never wait.
        A build that raises stores nothing (the next caller tries again)."""
        with self._memo_guard:
            if key in self._memo:
                return self._memo[key]
            building = self._building.setdefault(key, threading.Lock())
        with building:
            with self._memo_guard:
                if key in self._memo:
                    return self._memo[key]
            value = build()
            size = approx_bytes(value)
            with self._memo_guard:
                self._memo[key] = value
                self._sizes[key] = size
                self._building.pop(key, None)
            return value

    # -- loading ------------------------------------------------------------------------
    def _load_nodes(self) -> None:
        """The tenant's nodes from its mapped view (memlib/io/views.py), their embeddings read from
        Lance on first use (``auto`` never reads them); from the Lance table when the version has
        no trustworthy view of the tenant."""
        try:
            tbl: pa.Table | pa.RecordBatch = self.reader.view(VIEW_NODES, self.tenant)
            self.view_used = True
        except ViewError as exc:
            log.debug("tenant %s: nodes read from Lance (%s)", self.tenant, exc)
            tbl = self.reader.nodes(self.tenant, columns=NODE_COLUMNS)
            self.view_used = False
        if "embedding" in tbl.schema.names:
            self.embeddings = embedding_matrix(tbl.column("embedding"), self.reader.dim)
            tbl = tbl.drop_columns(["embedding"])
        self._nodes = tbl  # mapped from the view: its columns become Python objects when first read

    @_column
    def node_ids(self) -> list[str]:
        return self._nodes.column("node_id").to_pylist()

    @_column
    def kinds(self) -> np.ndarray:
        return np.asarray(self._nodes.column("kind").to_pylist(), dtype=object)

    @_column
    def texts(self) -> list[str]:
        return self._nodes.column("text").to_pylist()

    @_column
    def session_ids(self) -> list[str | None]:
        return self._nodes.column("session_id").to_pylist()

    @_column
    def provenance(self) -> list[tuple[str, ...]]:
        # tuples: once a collection has seen them, the garbage collector no longer tracks them
        return [tuple(p) if p else () for p in self._nodes.column("provenance").to_pylist()]

    @_column
    def attributes(self) -> list[str | None]:
        return self._nodes.column("attributes").to_pylist()

    @_column
    def importance(self) -> np.ndarray:
        return np.nan_to_num(np.asarray(self._nodes.column("importance").to_numpy(zero_copy_only=False),
                                        dtype=np.float32))

    @_column
    def row_of(self) -> dict[str, int]:
        return {nid: i for i, nid in enumerate(self.node_ids)}

    @_column
    def times(self) -> list[datetime | None]:
        """Each node's time (None when it has none): datetimes cost a LoCoMo tenant's 2,000 nodes 4 ms."""
        return _repeated_pylist(self._nodes.column("time"))

    @_column
    def time_epochs(self) -> np.ndarray:
        """Each node's time as epoch seconds (NaN when it has none, or the nodes have no times), made in
        Arrow: no Python datetimes."""
        if "time" not in self._nodes.schema.names:
            return np.full(self.n_nodes, np.nan)
        col = self._nodes.column("time")
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if not pa.types.is_timestamp(arr.type):
            return np.full(self.n_nodes, np.nan)
        per_s = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[arr.type.unit]
        return np.asarray(pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False), dtype=np.float64) / per_s

    def attribute(self, row: int) -> str | None:
        """One node's attributes (JSON text), without making the whole column Python objects."""
        if "attributes" in self.__dict__:
            return self.attributes[row]
        return self._nodes.column("attributes")[row].as_py()

    @cached_property
    def embeddings(self) -> np.ndarray:
        """(nodes, dim) L2-normalized node embeddings in node order (null rows zero), read from the
        pinned Lance table on first use and then kept (counted in :attr:`nbytes` from then on)."""
        with self._lock:
            if "embeddings" in self.__dict__:  # read by another thread meanwhile
                return self.__dict__["embeddings"]
            # every column, checked against the digest written with the rows (a flipped byte in a
            # Lance data file reads without an error): DamagedFileError, never a matrix from it
            tbl = self.reader.checked_rows(self.tenant, ["node_id", "embedding"])
            if tbl.num_rows != self.n_nodes:
                raise RuntimeError(f"tenant {self.tenant!r}: Lance holds {tbl.num_rows} nodes, its view "
                                   f"{self.n_nodes} (version {self.version})")
            order = pa.array([self.row_of[n] for n in tbl.column("node_id").to_pylist()], pa.int64())
            tbl = tbl.take(pc.sort_indices(order))
            matrix = embedding_matrix(tbl.column("embedding"), self.reader.dim)
            self._embedding_bytes = matrix.nbytes
            return matrix

    def _load_turns(self) -> None:
        try:
            tbl: pa.Table | pa.RecordBatch = self.reader.view(VIEW_TURNS, self.tenant)
        except ViewError:
            tbl = self.reader.table("turns", self.tenant, columns=TURN_COLUMNS)
            tbl = tbl.sort_by([("session_index", "ascending"), ("turn_index", "ascending")])
        cols = {c: tbl.column(c).to_pylist() for c in ("node_id", "turn_id", "session_id", "text", "speaker", "role")}
        cols["session_time"] = _repeated_pylist(tbl.column("session_time"))
        infos = map(TurnInfo._make, zip(cols["node_id"], cols["turn_id"], cols["session_id"], cols["session_time"],
                                        cols["text"], cols["speaker"], cols["role"]))
        self.turns: dict[str, TurnInfo] = dict(zip(cols["node_id"], infos))
        self.turn_order: list[str] = cols["node_id"]  # turns in conversation order

    @_column
    def turn_by_source(self) -> dict[str, str]:
        """Source turn id -> turn node id."""
        return {info.turn_id: node for node, info in self.turns.items()}

    # -- lookups ------------------------------------------------------------------------
    @property
    def version(self) -> str:
        return self.reader.version

    @property
    def n_nodes(self) -> int:
        return self._nodes.num_rows

    def rows_of_kind(self, kinds: Iterable[str] | None) -> np.ndarray:
        """Row indexes of nodes whose kind is in ``kinds`` (all rows for None)."""
        if kinds is None:
            return np.arange(self.n_nodes)
        wanted = [getattr(k, "value", k) for k in kinds]
        return np.flatnonzero(np.isin(self.kinds, wanted))

    def turns_of(self, node_id: str) -> list[str]:
        """Source turn node ids of a node: a turn is itself, others through provenance."""
        if node_id in self.turns:
            return [node_id]
        row = self.row_of.get(node_id)
        if row is None:
            return []
        return [t for t in self.provenance[row] if t in self.turns]

    def where(self, kinds: Iterable[str] | None = None) -> str:
        """Lance filter for this tenant (and kinds)."""
        clause = f"tenant_id = {sql_str(self.tenant)}"
        if kinds is not None:
            clause += " AND kind IN (" + ", ".join(sql_str(getattr(k, "value", k)) for k in kinds) + ")"
        return clause

    @property
    def table(self):
        """The lancedb nodes table pinned to this store version (the tenant's rows checked first)."""
        self.reader.check_lance_rows(self.tenant, "nodes")
        return self.reader.nodes_table()

    @property
    def turn_text_table(self):
        """The turn-only full-text table (own BM25 statistics), or None in older stores (the tenant's
        rows checked first)."""
        self.reader.check_lance_rows(self.tenant, "turn_text")
        return self.reader.turn_text_table()

    # -- query embedding and graph -------------------------------------------------------
    def embed_query(self, query: str) -> np.ndarray:
        if self.embedder is None:
            raise RuntimeError("this TenantIndex has no query embedder; pass one (memlib.embed.get_embedder)")
        return np.asarray(self.embedder.embed_queries([query])[0], dtype=np.float32)

    @cached_property
    def graph_data(self) -> bytes | None:
        """The tenant's graph as stored (graph-tool ``.gt`` bytes), or None when it has none."""
        return self.reader.graph_bytes(self.tenant)

    @property
    def has_graph(self) -> bool:
        return self.graph_data is not None

    @cached_property
    def graph(self) -> Any:
        """The tenant graph via memlib.graph.load (loaded on first use, then kept)."""
        with self._lock:
            if "graph" in self.__dict__:  # loaded by another thread meanwhile
                return self.__dict__["graph"]
            from memlib.graph.build import load

            if self.graph_data is None:
                raise FileNotFoundError(f"no graph for tenant {self.tenant!r} in {self.reader.graph_file(self.tenant)}")
            return load(self.graph_data)
