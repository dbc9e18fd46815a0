"""Derived-node vectors pooled from the turns' token vectors, without an encoder pass.

A derived node (fact, triplet, concept, entity, event, segment, session, clue, reflection) gets
the normalized mean over the token positions of its own text, each position the mean of the
token vectors with that WordPiece id in the node's provenance turns, or over the tenant's
turns when none of them has the id (its *fallback ids*). :class:`SpanPooler` computes what
that needs once and pools any subset of the nodes to the same bits as the whole table, which
is what lets a nightly run pool only the nodes whose inputs changed
(:mod:`memlib.compose.reuse`). The sums read the turns' float16 rows where they lie
(:class:`TokenRows`, :mod:`memlib.compose.pool_kernels`); the tenant-wide means come from exact
per-id sums (:class:`IdSums`), which a nightly run updates from its added turns alone. Measured:
docs/decisions/0008-span-pooled-derived-vectors.md and docs/decisions/0014-tenant-reuse.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from scipy import sparse

from memlib import schema
from memlib.compose.vectors import TOKEN_DIM, TurnVectors, binary_views, by_node_id, pooled_vectors


def span_pooled_vectors(nodes: pa.Table, tv: TurnVectors, tokenizer: Any) -> np.ndarray:
    """Vector of every node from the token vectors of the tenant's turns ``tv``: turn nodes keep
    their own; a derived node gets the normalized mean over the token positions of its own text,
    each position taking the mean of the token vectors with its WordPiece id in the node's
    provenance turns or, when none of them has that id (a name or date the extraction wrote in),
    the mean of the id's vectors over every turn of ``tv`` (from exact sums, :class:`IdSums`). A
    node none of whose tokens occurs anywhere keeps the mean of its turns' vectors.

    Every position of the node's text counts once, as in an encoding of that text: a name a fact
    repeats weighs more, a word its turn repeats does not. Pooling the set of the text's ids over
    every matching row instead (the earlier rule) left a fact close to its turn (mean cosine 0.86
    on locomo_dev3) and cost ``gaama`` 6 points of turn R@10
    (docs/decisions/0008-span-pooled-derived-vectors.md)."""
    return span_pooled_with_fallbacks(nodes, tv, tokenizer)[0]


def span_pooled_with_fallbacks(nodes: pa.Table, tv: TurnVectors,
                               tokenizer: Any) -> tuple[np.ndarray, dict[int, Fallback], IdSums]:
    """:func:`span_pooled_vectors`, per derived node row its :class:`Fallback`
    (:meth:`SpanPooler.pool_into`), and the tenant's per-id sums (:class:`IdSums`)."""
    assert tv.token_ids is not None and tv.token_vectors is not None
    out = pooled_vectors(nodes, tv.node_ids, tv.vectors)
    pooler = SpanPooler.of(nodes, tv, tokenizer)
    if pooler is None:
        return out, {}, IdSums.of(tv.token_ids, tv.token_vectors)
    fallbacks = pooler.pool_into(out, np.arange(pooler.derived.size), is_clue(nodes, pooler.derived))
    return out, dict(zip(pooler.derived.tolist(), fallbacks)), pooler.sums


def is_clue(nodes: pa.Table, rows: np.ndarray) -> np.ndarray:
    """Per row of ``rows``: whether that node is a clue. A clue keeps its local sum whatever its
    fallback ids: its published vector is the merged one, so a later run recomputes its pooled
    vector from the local sum and the tenant means (:func:`memlib.compose.reuse.pooled_reusing`)."""
    kinds = nodes.column("kind").take(pa.array(np.asarray(rows, dtype=np.int64))).to_numpy(zero_copy_only=False)
    return np.asarray(kinds == schema.NodeKind.CLUE.value, dtype=bool)


@dataclass
class SpanPooler:
    """What pooling the derived nodes of a node table needs, computed once: which rows are
    derived, their texts' WordPiece ids and provenance, and the tenant's token rows. Each derived
    node's vector depends on its own text, its provenance turns and the tenant's turns only, so
    any subset of the nodes pools to the same bits as the whole table (what lets a nightly run
    pool only the nodes whose inputs changed, :mod:`memlib.compose.reuse`)."""
    derived: np.ndarray             # row of each derived node in the table
    words: list[np.ndarray]         # per derived node: the WordPiece ids of its text
    provenance: list[Any]           # per derived node: its provenance turn ids
    rows: TokenRows
    turn_index: dict[str, int]      # turn id -> its index in the token rows' turns
    sums: IdSums                    # the tenant's per-id sums, for the means of fallback ids

    @classmethod
    def of(cls, nodes: pa.Table, tv: TurnVectors, tokenizer: Any, rows: np.ndarray | None = None,
           sums: IdSums | None = None) -> SpanPooler | None:
        """The derived nodes of ``nodes`` (only those at ``rows`` when given: their texts alone
        are tokenized); None when there is nothing to pool (no such node, or no turn). ``sums``:
        the per-id sums of every turn of ``tv`` when known (a nightly run adds the added turns'
        rows to the published ones); else they are computed from every token row."""
        assert tv.token_ids is not None and tv.token_vectors is not None
        if rows is None:
            kinds = np.asarray(nodes.column("kind").to_pylist(), dtype=object)
            derived = np.flatnonzero(kinds != schema.NodeKind.TURN.value)
        else:
            derived = np.asarray(rows, dtype=np.int64)
        if derived.size == 0 or not tv.token_ids:
            return None
        take = pa.array(derived)
        words = tokenizer.ids([t or "" for t in nodes.column("text").take(take).to_pylist()])
        tv = by_node_id(tv)
        vocab = 1 + max(max((int(t.max()) for t in tv.token_ids if t.size), default=0),
                        max((int(w.max()) for w in words if w.size), default=0))
        token_rows = TokenRows.of(tv, vocab)
        return cls(derived, words, nodes.column("provenance").take(take).to_pylist(), token_rows,
                   {n: i for i, n in enumerate(tv.node_ids)}, sums if sums is not None else IdSums.of_rows(token_rows))

    def positions(self, which: np.ndarray) -> Positions:
        """The token positions of the derived nodes ``which`` (indices into ``derived``)."""
        return Positions.of([self.words[i] for i in which], [self.provenance[i] for i in which], self.turn_index)

    def pool_into(self, out: np.ndarray, which: np.ndarray, keep_local: np.ndarray | None = None) -> list[Fallback]:
        """Write the pooled vectors of the derived nodes ``which`` into their rows of ``out``
        (left as they are for a node none of whose tokens occurs in any turn). Returns per node
        of ``which`` its :class:`Fallback`: the ids of its text that none of its provenance turns
        has, whose vectors it took from every turn, and the sum over its other positions (kept
        when it has such ids, or when ``keep_local`` says so for it)."""
        if which.size == 0:
            return []
        pos = self.positions(which)
        local, found = self.rows.local_sums(pos, which.size)
        missing = found == 0
        fill = fill_sums(pos.node[missing], pos.ids[missing], pos.count[missing], self.sums, which.size, local.shape[1])
        normalize_into(out, self.derived[which], local + fill)
        return pos.fallbacks(found, which.size, local, keep_local)

    def fallbacks(self, which: np.ndarray) -> list[Fallback]:
        """Per derived node of ``which``: its fallback ids and their counts, as :meth:`pool_into`
        returns them, without pooling (``local`` None)."""
        pos = self.positions(which)
        return pos.fallbacks(self.rows.found(pos), which.size, None)


@dataclass
class Fallback:
    """A derived node's positions whose WordPiece id none of its provenance turns has: those ids
    (ascending, int32), how many positions each has (int32), and ``local``, the sum over the
    node's other positions (float32, what its own turns give; None when not computed). Its
    vector is ``local`` plus each count times the id's mean over the tenant's turns, normalized,
    so a run that adds turns gives it its new vector from ``local`` and the new means alone,
    without reading its turns' token rows (:func:`memlib.compose.reuse.pooled_reusing`)."""
    ids: np.ndarray
    counts: np.ndarray
    local: np.ndarray | None = None


def normalize_into(out: np.ndarray, rows: np.ndarray, sums: np.ndarray) -> None:
    """``out[rows] = sums / |sums|`` for the sums that are not zero (the others left as they are)."""
    norms = np.linalg.norm(sums, axis=1)
    hit = norms > 1e-12
    out[rows[hit]] = sums[hit] / norms[hit, None]


def fill_sums(node: np.ndarray, ids: np.ndarray, count: np.ndarray, sums: IdSums, n_nodes: int,
              dim: int) -> np.ndarray:
    """(n_nodes, dim) float32: per node, the sum of ``count`` times the tenant's mean of ``ids``
    over its (node, id, count) rows, which come by node and then by id ascending; an id with no
    row in any turn adds nothing. A node's row is the same whichever other nodes are given."""
    out = np.zeros((n_nodes, dim), dtype=np.float32)
    keep = sums.count_of(ids) > 0
    if not keep.any():
        return out
    node, ids, count = node[keep], ids[keep], count[keep]
    fill_ids, slot = np.unique(ids, return_inverse=True)
    weights = sparse.csr_matrix((np.asarray(count, dtype=np.float32), (node, slot)), shape=(n_nodes, fill_ids.size))
    return np.asarray(weights @ sums.means(fill_ids), dtype=np.float32)


@dataclass
class IdSums:
    """Per WordPiece id of a tenant's token rows: how many rows carry it and their sum, exact
    (the float16 values as int64 multiples of 2^-24, :func:`memlib.compose.pool_kernels.id_sums`).
    An exact sum does not depend on the order of its terms, so the sums of a tenant's turns equal
    its published sums plus those of its added turns, and an id's mean (what a node pools for a
    fallback id) is the same in a full build and in a nightly run that read no old token row."""
    ids: np.ndarray     # int64, ascending
    counts: np.ndarray  # int64, each > 0
    sums: np.ndarray    # (n, dim) int64, in units of 2^-24

    @classmethod
    def of(cls, token_ids: Sequence[np.ndarray], token_vectors: Sequence[np.ndarray],
           dim: int = TOKEN_DIM) -> IdSums:
        """The sums over the token rows of the given turns."""
        from memlib.compose import pool_kernels

        if not token_ids:
            return cls.empty(dim)
        dim = next((int(v.shape[1]) for v in token_vectors if np.ndim(v) == 2), dim)
        flat = np.concatenate([np.asarray(t, dtype=np.int64) for t in token_ids])
        return cls._summed(flat, pool_kernels.TurnRows(list(token_vectors), dim))

    @classmethod
    def of_rows(cls, rows: TokenRows) -> IdSums:
        """The sums over every row of ``rows``, read through the kernel arrays it already built."""
        return cls._summed(rows.ids, rows.kernel_rows())

    @classmethod
    def _summed(cls, flat_ids: np.ndarray, rows: Any) -> IdSums:
        """``flat_ids``: the id of every token row of the turns of ``rows`` (a
        :class:`memlib.compose.pool_kernels.TurnRows`), in their order."""
        from memlib.compose import pool_kernels

        ids, slots = np.unique(flat_ids, return_inverse=True)
        sums, counts = pool_kernels.id_sums(slots.astype(np.int64), rows, ids.size)
        return cls(ids, counts, sums)

    @classmethod
    def empty(cls, dim: int = TOKEN_DIM) -> IdSums:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, dim), np.int64))

    def plus(self, other: IdSums, in_place: bool = False) -> IdSums:
        """The sums over both sets of rows (exact integers: the same whichever way they are added).
        ``in_place``: when ``other``'s ids are all among these, they are added into these arrays
        (no copy of the sums; this object then holds the result too)."""
        at = np.searchsorted(self.ids, other.ids)  # an append's ids are nearly always the tenant's: no union
        if self.ids.size and np.array_equal(self.ids[np.minimum(at, self.ids.size - 1)], other.ids):
            ids, counts, sums = (self.ids, self.counts, self.sums) if in_place else \
                (self.ids, self.counts.copy(), self.sums.copy())  # one copy, no temporaries
        else:
            ids = np.union1d(self.ids, other.ids)
            counts, sums = np.zeros(ids.size, np.int64), np.zeros((ids.size, self.sums.shape[1]), np.int64)
            mine = np.searchsorted(ids, self.ids)
            counts[mine], sums[mine] = self.counts, self.sums
            at = np.searchsorted(ids, other.ids)
        counts[at] += other.counts  # distinct positions: each row of ``other`` is added once
        sums[at] += other.sums
        return IdSums(ids, counts, sums)

    def changed_since(self, earlier: IdSums | None) -> np.ndarray:
        """The ids whose count or sum differ from ``earlier``'s (None: every id): their means moved."""
        if earlier is None:
            return self.ids.copy()
        ids = np.union1d(self.ids, earlier.ids)
        counts, sums = np.zeros((2, ids.size), np.int64), np.zeros((2, ids.size, self.sums.shape[1]), np.int64)
        for k, part in enumerate((self, earlier)):
            counts[k, np.searchsorted(ids, part.ids)], sums[k, np.searchsorted(ids, part.ids)] = part.counts, part.sums
        return ids[(counts[0] != counts[1]) | (sums[0] != sums[1]).any(axis=1)]

    def count_of(self, ids: np.ndarray) -> np.ndarray:
        """How many rows carry each of ``ids`` (0 for an id in no row)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.ids.size == 0:
            return np.zeros(ids.size, np.int64)
        at = np.minimum(np.searchsorted(self.ids, ids), self.ids.size - 1)
        return np.where(self.ids[at] == ids, self.counts[at], 0)

    def means(self, ids: np.ndarray) -> np.ndarray:
        """(len(ids), dim) float32: each id's mean row (every id must have rows)."""
        at = np.searchsorted(self.ids, np.asarray(ids, dtype=np.int64))
        from memlib.compose.pool_kernels import SUM_SCALE

        exact = self.sums[at].astype(np.float64) / SUM_SCALE  # a power of two: exact
        return (exact / self.counts[at, None]).astype(np.float32)

    def table(self, tenant: str) -> pa.Table:
        """As :data:`memlib.schema.TOKEN_SUMS` rows (each sum as the bytes of its int64 values)."""
        n, dim = self.sums.shape
        data = np.ascontiguousarray(self.sums, dtype=np.int64)
        offsets = (np.arange(n + 1, dtype=np.int64) * dim * 8).astype(np.int32)
        blobs = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        return pa.table({"tenant_id": pa.array([tenant] * n, pa.string()),
                         "id": pa.array(self.ids.astype(np.int32), pa.int32()),
                         "count": pa.array(self.counts, pa.int64()), "sum": blobs})

    @classmethod
    def from_table(cls, table: pa.Table, dim: int = TOKEN_DIM) -> IdSums:
        if table.num_rows == 0:
            return cls.empty(dim)
        table = table.sort_by("id")
        rows = binary_views(table.column("sum"), np.int64)
        if any(r is None for r in rows):
            raise ValueError("token_sums: a row without its sum")
        return cls(table.column("id").to_numpy().astype(np.int64), table.column("count").to_numpy().astype(np.int64),
                   np.stack(rows))


@dataclass
class Positions:
    """The token positions of derived nodes' texts, one row per (node, distinct WordPiece id):
    ``node`` (index among the derived nodes), ``ids``, ``count`` (positions with that id), and
    per row the index of each provenance turn in ``tv`` (``turn_row``, ``turn`` flattened)."""
    node: np.ndarray
    ids: np.ndarray
    count: np.ndarray
    turn_row: np.ndarray
    turn: np.ndarray

    @classmethod
    def of(cls, words: Sequence[np.ndarray], provenance: Sequence[list[str] | None],
           turn_index: dict[str, int]) -> Positions:
        """Rows by node, then by id ascending; each row's turns in provenance order."""
        lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
        flat = np.concatenate([np.asarray(w, dtype=np.int64) for w in words]) if len(words) else np.zeros(0, np.int64)
        width = int(flat.max()) + 1 if flat.size else 1
        keys, count = np.unique(np.repeat(np.arange(len(words), dtype=np.int64), lengths) * width + flat,
                                return_counts=True)
        node, ids = keys // width, keys % width
        turns = [[turn_index[t] for t in prov or [] if t in turn_index] for prov in provenance]
        n_turns = np.fromiter((len(t) for t in turns), dtype=np.int64, count=len(turns))
        first = np.r_[0, np.cumsum(n_turns)][:-1]
        flat_turns = np.fromiter((i for t in turns for i in t), dtype=np.int64, count=int(n_turns.sum()))
        per_row = n_turns[node] if node.size else np.zeros(0, np.int64)
        total = int(per_row.sum())
        turn_row = np.repeat(np.arange(node.size, dtype=np.int64), per_row)
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(per_row) - per_row, per_row)
        turn = flat_turns[first[node][turn_row] + within] if total else np.zeros(0, np.int64)
        return cls(node, ids, count.astype(np.float32), turn_row, turn)

    def fallbacks(self, found: np.ndarray, n_nodes: int, local: np.ndarray | None,
                  keep_local: np.ndarray | None = None) -> list[Fallback]:
        """Per node: the ids of its rows that ``found`` (:meth:`TokenRows.found`) says none of its
        provenance turns has, ascending, with their counts, and its row of ``local`` when given
        and the node has such an id (or ``keep_local`` is true for it)."""
        missing = found == 0
        bounds = np.searchsorted(self.node[missing], np.arange(n_nodes + 1))
        ids = self.ids[missing].astype(np.int32)
        counts = self.count[missing].astype(np.int32)
        keep = np.zeros(n_nodes, bool) if keep_local is None else np.asarray(keep_local, bool)
        return [Fallback(ids[a:b], counts[a:b], local[i].copy() if local is not None and (b > a or keep[i]) else None)
                for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]


@dataclass
class TokenRows:
    """Every token row of a tenant's turns: its owner turn and WordPiece id, with the rows sorted
    by key ``turn * vocab + id`` for lookups; the vectors stay in the turns' own float16 arrays
    (``per_turn``, rows ``starts[t]:starts[t + 1]`` of the concatenation), and a product reads
    only the rows it weighs (at 2,500 LongMemEval sessions every row in float32 was about 8 GB)."""
    owner: np.ndarray
    ids: np.ndarray
    per_turn: list[np.ndarray]
    starts: np.ndarray
    vocab: int
    order: np.ndarray
    sorted_keys: np.ndarray
    _kernel: Any = None  # pool_kernels.TurnRows of per_turn, made on first use

    @property
    def dim(self) -> int:
        return next((int(v.shape[1]) for v in self.per_turn if v.ndim == 2), TOKEN_DIM)

    @classmethod
    def of(cls, tv: TurnVectors, vocab: int) -> TokenRows:
        """``vocab``: above every WordPiece id of the turns and of the texts to pool."""
        assert tv.token_ids is not None and tv.token_vectors is not None
        lengths = np.fromiter((t.size for t in tv.token_ids), dtype=np.int64, count=len(tv.token_ids))
        owner = np.repeat(np.arange(len(tv.token_ids), dtype=np.int64), lengths)
        ids = np.concatenate(tv.token_ids).astype(np.int64)
        keys = owner * vocab + ids
        order = np.argsort(keys, kind="stable")
        return cls(owner, ids, list(tv.token_vectors), np.r_[0, np.cumsum(lengths)], vocab, order, keys[order])

    def times(self, weights: sparse.csr_matrix) -> np.ndarray:
        """``weights @ V`` (V: every token row, float32), each row of the product adding the same
        terms in the same order as scipy's product would; the rows are read where they lie
        (:func:`memlib.compose.pool_kernels.csr_times_turn_rows`)."""
        from memlib.compose import pool_kernels

        weights = weights.tocsr()
        csr = (weights.indptr.astype(np.int64), weights.indices.astype(np.int64), weights.data.astype(np.float32))
        return pool_kernels.csr_times_turn_rows(csr, self.owner, self.starts, self.kernel_rows())

    def kernel_rows(self) -> Any:
        """The turns' arrays as the kernels read them (:class:`memlib.compose.pool_kernels.TurnRows`), made once."""
        if self._kernel is None:
            from memlib.compose import pool_kernels

            self._kernel = pool_kernels.TurnRows(self.per_turn, self.dim)
        return self._kernel

    def local_sums(self, pos: Positions, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
        """(n_nodes, dim): per node, the sum over its positions whose id its provenance turns hold
        of each position's vector (the mean of the id's rows there); and per position row, how
        many rows of its id the node's provenance turns hold."""
        local, found = self._local(pos, n_nodes)
        return self.times(local), found

    def found(self, pos: Positions) -> np.ndarray:
        """Per position row: how many token rows of its id its node's provenance turns hold."""
        keys = pos.turn * self.vocab + pos.ids[pos.turn_row]
        counts = (np.searchsorted(self.sorted_keys, keys, side="right")
                  - np.searchsorted(self.sorted_keys, keys, side="left"))
        return np.bincount(pos.turn_row, weights=counts, minlength=pos.ids.size)

    def _local(self, pos: Positions, n_nodes: int) -> tuple[sparse.csr_matrix, np.ndarray]:
        """Weights (node x token row) of the ids found in the node's own turns: each position
        spread over the rows of its id there; and per position row, how many rows it found."""
        keys = pos.turn * self.vocab + pos.ids[pos.turn_row]
        lo = np.searchsorted(self.sorted_keys, keys, side="left")
        counts = np.searchsorted(self.sorted_keys, keys, side="right") - lo
        found = np.bincount(pos.turn_row, weights=counts, minlength=pos.ids.size)
        hit = counts > 0
        lo, counts, which = lo[hit], counts[hit], pos.turn_row[hit]
        total = int(counts.sum())
        starts = np.repeat(lo - np.cumsum(np.r_[0, counts[:-1]]), counts) + np.arange(total)
        which = np.repeat(which, counts)
        weight = pos.count[which] / found[which]
        matrix = sparse.csr_matrix((weight.astype(np.float32), (pos.node[which], self.order[starts])),
                                   shape=(n_nodes, self.ids.size))
        return matrix, found
