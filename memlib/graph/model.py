"""The in-memory form of one tenant's memory graph.

:class:`MemoryGraph` keeps the graph as aligned numpy arrays (vertex order = graph-tool
vertex index, edge order = graph-tool edge index) plus, when it came from :func:`build_graph`
or :func:`load`, the ``graph_tool.Graph`` that owns them on disk. Query-time kernels (PPR,
subgraph extraction) work on the arrays and on cached scipy matrices, so they never touch
graph-tool's Python layer per query; graph-tool owns the file format and global scores.

Direction: edges are stored directed as the ``edges`` table gives them (``src -> dst``).
Every propagation in this package traverses them both ways (the memory graph is
symmetrized for PPR and for neighbourhood expansion): a fact reached from a turn and a turn
reached from a fact are both meaningful evidence paths.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class Adjacency:
    """Symmetrized adjacency in CSR layout: for vertex ``u`` the slots
    ``indptr[u]:indptr[u+1]`` list its neighbours ``nbr`` and the edge id ``eid`` that
    links them; each stored edge has one slot at each endpoint, ``fwd`` marks the slot at
    its ``src``. A slot is one directed traversal ``u -> nbr``: transition matrices are
    built slot-wise, already sorted by source, with no sort at query time."""

    indptr: np.ndarray
    nbr: np.ndarray
    eid: np.ndarray
    fwd: np.ndarray

    def slots(self, vertices: np.ndarray) -> np.ndarray:
        """Positions in ``nbr``/``eid`` of all adjacency slots of ``vertices`` (vectorized)."""
        starts = self.indptr[vertices]
        counts = self.indptr[vertices + 1] - starts
        total = int(counts.sum())
        if total == 0:
            return np.zeros(0, dtype=np.int64)
        offsets = np.repeat(starts - np.cumsum(counts) + counts, counts)
        return offsets + np.arange(total, dtype=np.int64)

    def rows(self) -> np.ndarray:
        """Source vertex of every slot."""
        n = self.indptr.size - 1
        return np.repeat(np.arange(n, dtype=np.int64), np.diff(self.indptr))


def build_adjacency(n: int, src: np.ndarray, dst: np.ndarray) -> Adjacency:
    ends = np.concatenate([src, dst])
    other = np.concatenate([dst, src])
    eids = np.concatenate([np.arange(src.size), np.arange(src.size)]).astype(np.int64)
    fwd = np.concatenate([np.ones(src.size, dtype=bool), np.zeros(src.size, dtype=bool)])
    order = np.argsort(ends, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(ends, minlength=n), out=indptr[1:])
    return Adjacency(indptr=indptr, nbr=other[order].astype(np.int64), eid=eids[order], fwd=fwd[order])


@dataclass(eq=False)
class MemoryGraph:
    """One tenant's memory graph (see the module docstring for direction conventions).

    ``kind``/``edge_kind``/``relation`` are small-integer codes into the vocabularies
    ``node_kinds``/``edge_kinds``/``relations`` (``relation == -1``: no label). ``time`` is
    microseconds since the epoch as float64 (exact below year 2255), NaN when unknown.
    ``degree`` is the vertex's total degree in the *tenant* graph; subgraphs keep the
    parent's degrees so hub dampening treats a hub as a hub even when it is cut.
    """

    ids: np.ndarray
    kind: np.ndarray
    node_kinds: tuple[str, ...]
    time: np.ndarray
    importance: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    edge_kind: np.ndarray
    edge_kinds: tuple[str, ...]
    weight: np.ndarray
    relation: np.ndarray
    relations: tuple[str, ...]
    degree: np.ndarray
    parent_index: np.ndarray | None = None
    parent: "MemoryGraph | None" = field(default=None, repr=False)
    gt: Any = None
    _index: dict[str, int] | None = field(default=None, repr=False)
    _adj: Adjacency | None = field(default=None, repr=False)
    _cache: dict[Hashable, Any] = field(default_factory=dict, repr=False)

    @property
    def num_nodes(self) -> int:
        return int(self.ids.size)

    @property
    def num_edges(self) -> int:
        return int(self.src.size)

    # -- lookup ------------------------------------------------------------------------
    def index(self) -> dict[str, int]:
        """node id -> vertex index (built once, on first use)."""
        if self._index is None:
            self._index = {nid: i for i, nid in enumerate(self.ids.tolist())}
        return self._index

    def vertex(self, node_id: str) -> int:
        try:
            return self.index()[node_id]
        except KeyError:
            raise KeyError(f"node {node_id!r} is not in this graph") from None

    def vertices(self, node_ids: Iterable[str]) -> np.ndarray:
        """Vertex indices of ``node_ids``; -1 for ids not in the graph. A subgraph answers
        through its parent's index (no per-query dict build)."""
        if self._index is None and self.parent is not None and self.parent_index is not None:
            pv = self.parent.vertices(node_ids)
            if self.num_nodes == 0:
                return np.full(pv.size, -1, dtype=np.int64)
            pos = np.minimum(np.searchsorted(self.parent_index, pv), self.num_nodes - 1)
            return np.where((pv >= 0) & (self.parent_index[pos] == pv), pos, -1).astype(np.int64)
        idx = self.index()
        return np.fromiter((idx.get(n, -1) for n in node_ids), dtype=np.int64)

    def kind_names(self) -> np.ndarray:
        return np.asarray(self.node_kinds, dtype=object)[self.kind]

    def edge_kind_names(self) -> np.ndarray:
        return np.asarray(self.edge_kinds, dtype=object)[self.edge_kind]

    def kind_mask(self, kind: str) -> np.ndarray:
        kind = getattr(kind, "value", kind)
        if kind not in self.node_kinds:
            return np.zeros(self.num_nodes, dtype=bool)
        return self.kind == self.node_kinds.index(kind)

    def edge_kind_vector(self, table: dict[str, float], default: float) -> np.ndarray:
        """Per-edge value looked up by edge kind (``default`` for kinds not in ``table``)."""
        per_code = np.array([float(table.get(k, default)) for k in self.edge_kinds] or [default])
        return per_code[self.edge_kind]

    # -- cached structures -------------------------------------------------------------
    def adjacency(self) -> Adjacency:
        if self._adj is None:
            self._adj = build_adjacency(self.num_nodes, self.src, self.dst)
        return self._adj

    def cached(self, key: Hashable, make) -> Any:
        """Memoize a derived structure (e.g. a transition matrix per weighting)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def adjacency_matrix(self) -> sp.csr_matrix:
        """Symmetric 0/1 pattern (duplicates summed) as CSR; used by centralities and tests."""
        def make():
            n = self.num_nodes
            rows = np.concatenate([self.src, self.dst])
            cols = np.concatenate([self.dst, self.src])
            return sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
        return self.cached(("adjacency_matrix",), make)


def scores_to_dict(graph: MemoryGraph, scores: np.ndarray, *, min_score: float = 0.0) -> dict[str, float]:
    """``{node_id: score}`` for the vertices whose score exceeds ``min_score``."""
    keep = np.flatnonzero(scores > min_score)
    return dict(zip(graph.ids[keep].tolist(), scores[keep].tolist()))
