"""Derived-node vectors pooled from the turns' token vectors, without an encoder pass.

A derived node (fact, triplet, concept, entity, event, segment, session, clue, reflection) gets
the normalized mean over the token positions of its own text, each position the mean of the
token vectors with that WordPiece id in the node's provenance turns, or over the tenant's
turns when none of them has the id (its *fallback ids*). :class:`SpanPooler` computes what
that needs once and pools any subset of the nodes to the same bits as the whole table, which
is what lets a nightly run pool only the nodes whose inputs changed
(:mod:`memlib.compose.reuse`). The sums read the turns' float16 rows where they lie
(:class:`TokenRows`, :mod:`memlib.compose.pool_kernels`). Measured: docs/benchmarks.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from scipy import sparse

from memlib import schema
from memlib.compose.vectors import TOKEN_DIM, TurnVectors, pooled_vectors


def span_pooled_vectors(nodes: pa.Table, tv: TurnVectors, tokenizer: Any) -> np.ndarray:
    """Vector of every node from the token vectors of the tenant's turns ``tv``: turn nodes keep
    their own; a derived node gets the normalized mean over the token positions of its own text,
    each position taking the mean of the token vectors with its WordPiece id in the node's
    provenance turns or, when none of them has that id (a name or date the extraction wrote in),
    the mean of the id's vectors over every turn of ``tv``. A node none of whose tokens occurs
    anywhere keeps the mean of its turns' vectors.

    Every position of the node's text counts once, as in an encoding of that text: a name a fact
    repeats weighs more, a word its turn repeats does not. Pooling the set of the text's ids over
    every matching row instead (the earlier rule) left a fact close to its turn (mean cosine 0.86
    on locomo_dev3) and cost ``gaama`` 6 points of turn R@10 (docs/benchmarks.md)."""
    return span_pooled_with_fallbacks(nodes, tv, tokenizer)[0]


def span_pooled_with_fallbacks(nodes: pa.Table, tv: TurnVectors,
                               tokenizer: Any) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """:func:`span_pooled_vectors`, and per derived node row its fallback ids
    (:meth:`SpanPooler.pool_into`)."""
    assert tv.token_ids is not None and tv.token_vectors is not None
    out = pooled_vectors(nodes, tv.node_ids, tv.vectors)
    pooler = SpanPooler.of(nodes, tv, tokenizer)
    if pooler is None:
        return out, {}
    fallbacks = pooler.pool_into(out, np.arange(pooler.derived.size))
    return out, dict(zip(pooler.derived.tolist(), fallbacks))


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

    @classmethod
    def of(cls, nodes: pa.Table, tv: TurnVectors, tokenizer: Any, rows: np.ndarray | None = None) -> SpanPooler | None:
        """The derived nodes of ``nodes`` (only those at ``rows`` when given: their texts alone
        are tokenized); None when there is nothing to pool (no such node, or no turn)."""
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
        return cls(derived, words, nodes.column("provenance").take(take).to_pylist(), TokenRows.of(tv, vocab),
                   {n: i for i, n in enumerate(tv.node_ids)})

    def positions(self, which: np.ndarray) -> Positions:
        """The token positions of the derived nodes ``which`` (indices into ``derived``)."""
        return Positions.of([self.words[i] for i in which], [self.provenance[i] for i in which], self.turn_index)

    def pool_into(self, out: np.ndarray, which: np.ndarray) -> list[np.ndarray]:
        """Write the pooled vectors of the derived nodes ``which`` into their rows of ``out``
        (left as they are for a node none of whose tokens occurs in any turn). Returns per node
        of ``which`` its fallback ids: those of its text that none of its provenance turns has
        (ascending), whose vectors it took from every turn."""
        if which.size == 0:
            return []
        pos = self.positions(which)
        sums, found = self.rows.position_sums(pos, which.size)
        norms = np.linalg.norm(sums, axis=1)
        hit = norms > 1e-12
        out[self.derived[which[hit]]] = sums[hit] / norms[hit, None]
        return pos.fallback_ids(found, which.size)

    def fallback_ids(self, which: np.ndarray) -> list[np.ndarray]:
        """Per derived node of ``which``: its fallback ids, as :meth:`pool_into` returns them,
        without pooling."""
        pos = self.positions(which)
        return pos.fallback_ids(self.rows.found(pos), which.size)


def by_node_id(tv: TurnVectors) -> TurnVectors:
    """``tv`` with its turns in node id order: sums over several turns then add in one order,
    whatever order the turns came in (a Ray build reads them back by session block), so a node's
    vector is the same to the bit in every build."""
    assert tv.token_ids is not None and tv.token_vectors is not None
    order = sorted(range(len(tv.node_ids)), key=tv.node_ids.__getitem__)
    return TurnVectors([tv.node_ids[i] for i in order], tv.vectors[order], [tv.token_ids[i] for i in order],
                       [tv.token_vectors[i] for i in order])


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

    def fallback_ids(self, found: np.ndarray, n_nodes: int) -> list[np.ndarray]:
        """Per node: the ids of its rows that ``found`` (:meth:`TokenRows.found`) says none of its
        provenance turns has, ascending, as int32."""
        missing = found == 0
        bounds = np.searchsorted(self.node[missing], np.arange(n_nodes + 1))
        ids = self.ids[missing].astype(np.int32)
        return [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


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
    _typed: Any = None

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
        per_turn, table = self._kernel_rows()
        return pool_kernels.csr_times_turn_rows(weights.indptr.astype(np.int64), weights.indices.astype(np.int64),
                                                weights.data.astype(np.float32), self.owner, self.starts, per_turn,
                                                table, self.dim)

    def _kernel_rows(self) -> tuple[Any, np.ndarray]:
        """The turns' arrays as the kernel reads them: float16 ones as their uint16 bits (with the
        float16 -> float32 table), anything else as float32; built once."""
        if self._typed is None:
            from numba import types
            from numba.typed import List

            from memlib.compose import pool_kernels

            half = all(v.dtype == np.float16 for v in self.per_turn)
            arrays = []
            for v in self.per_turn:
                v = v.reshape(-1, self.dim)
                v = v.view(np.uint16) if half else np.ascontiguousarray(v, dtype=np.float32).view()
                v.flags.writeable = False  # one array type for the list: arrays read back are read-only
                arrays.append(v)
            # one call: appending to a typed list one array at a time costs ~0.2 ms each (5 s at 26k turns)
            typed = List(arrays) if arrays else List.empty_list(types.Array(types.uint16 if half else types.float32,
                                                                            2, "C", readonly=True))
            table = pool_kernels.HALF_TO_FLOAT if half else pool_kernels.table_none()
            self._typed = (typed, table)
        return self._typed

    def position_sums(self, pos: Positions, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
        """(n_nodes, dim): per node, the sum over its positions of each position's vector; and
        per position row, how many rows of its id the node's provenance turns hold."""
        local, found = self._local(pos, n_nodes)
        fill = self._fill(pos, found, n_nodes)
        return self.times(local) + fill, found

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

    def _fill(self, pos: Positions, found: np.ndarray, n_nodes: int) -> np.ndarray:
        """(n_nodes, dim): the positions whose id is in none of the node's turns, each the mean
        of its id's rows over every turn (none where the id occurs in no turn)."""
        out = np.zeros((n_nodes, self.dim), dtype=np.float32)
        per_id = np.bincount(self.ids, minlength=self.vocab)
        need = (found == 0) & (per_id[pos.ids] > 0)
        if not need.any():
            return out
        fill_ids, slot = np.unique(pos.ids[need], return_inverse=True)
        rows = np.flatnonzero(np.isin(self.ids, fill_ids))
        means = sparse.csr_matrix(((1.0 / per_id[self.ids[rows]]).astype(np.float32),
                                   (np.searchsorted(fill_ids, self.ids[rows]), rows)),
                                  shape=(fill_ids.size, self.ids.size))
        means = self.times(means)
        weights = sparse.csr_matrix((pos.count[need], (pos.node[need], slot)), shape=(n_nodes, fill_ids.size))
        return np.asarray(weights @ means, dtype=np.float32)
