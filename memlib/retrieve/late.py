"""Token-level late interaction (MaxSim) over a small encoder's token vectors.

A turn is scored by ``sum_q idf(q) * max_t cos(q, t)`` over the query's content tokens ``q``
and the turn's content tokens ``t`` (special and punctuation tokens dropped); ``idf`` is
computed over the tenant's turns. A tenant's tokens are one :class:`TokenMatrix`. The parts
around it live beside this module: which encoder (:mod:`memlib.embed.token_model`), the
encoder (:mod:`memlib.embed.token_encoder`), the int8 similarity kernel
(:mod:`memlib.retrieve.int8_maxsim`; ``exact=True`` keeps numpy float32) and the per-tenant
matrix cache in memory and on disk (:mod:`memlib.retrieve.matrix_cache`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from memlib.lazy import cached_property
from memlib.retrieve.int8_maxsim import INT8_MAX_VALUES, Int8Similarity, transposed

if TYPE_CHECKING:
    from memlib.embed.token_encoder import TokenEncoder


class TokenMatrix:
    """All content tokens of a tenant's turns: ``vectors[i]`` belongs to turn ``owner[i]``
    (turn position in ``turn_ids``); ``idf`` per vocabulary id over those turns.

    ``vectors`` (T, dim) float16, as stored on disk (half the memory of float32), may be given
    as a function making them: a matrix read from kept sessions joins its turns' vectors only
    when something reads them (the exact kernel, the first stage of big tenants), not for the
    int8 kernel. ``quantized``: the vectors' int8 rows and float32 scales as the build kept
    them, each one array or a list of per-turn arrays; the int8 kernel then takes them instead
    of quantizing the tenant at its first query."""

    def __init__(self, turn_ids: Sequence[str], owner: np.ndarray, vectors: np.ndarray | Callable[[], np.ndarray],
                 idf: np.ndarray, quantized: tuple[Any, Any] | None = None, dim: int | None = None):
        self.turn_ids: tuple[str, ...] = tuple(turn_ids)   # turn node ids, conversation order
        self.owner = owner                                  # (T,) int32
        self.idf = idf                                      # (vocab,) float32
        self.quantized = quantized
        if callable(vectors):
            self._make_vectors = vectors
            self.dim = int(dim if dim is not None else 384)
        else:
            self.__dict__["vectors"] = vectors
            self.dim = int(vectors.shape[1]) if vectors.ndim == 2 else int(dim or 384)

    @cached_property
    def vectors(self) -> np.ndarray:
        return self._make_vectors()

    @property
    def n_turns(self) -> int:
        return len(self.turn_ids)

    @cached_property
    def groups(self) -> tuple[np.ndarray, np.ndarray]:
        """(owner per token, start of each owner's run); tokens are stored grouped by turn."""
        if np.any(np.diff(self.owner) < 0):
            raise ValueError("token matrix rows must be grouped by turn")
        return self.owner, np.flatnonzero(np.r_[True, self.owner[1:] != self.owner[:-1]])

    @property
    def int8_ok(self) -> bool:
        """Whether :class:`Int8Similarity` can hold these vectors (some, and within
        :data:`INT8_MAX_VALUES`)."""
        return 0 < self.owner.size * self.dim <= INT8_MAX_VALUES

    @cached_property
    def int8(self) -> Int8Similarity:
        if self.quantized is None:
            self.int8_from = "quantized"
            return Int8Similarity(self.vectors)
        v8, scale, *rest = self.quantized
        scale = scale if isinstance(scale, np.ndarray) else np.concatenate(scale)
        if rest and rest[0] is not None:  # the kept sessions' transposed rows, joined
            v8t = rest[0]()
        else:
            v8 = v8() if callable(v8) else v8 if isinstance(v8, np.ndarray) else np.concatenate(v8)
            v8t = transposed(v8)
        self.quantized, self.int8_from = None, "kept"  # the kernel holds its own (transposed) copy
        return Int8Similarity(quantized=(scale, v8t))

    @cached_property
    def float32(self) -> np.ndarray:
        """The vectors as float32, made on the first exact (float) MaxSim and kept."""
        return self.vectors.astype(np.float32)


def build_token_matrix(encoder: TokenEncoder, turn_ids: Sequence[str], texts: Sequence[str]) -> TokenMatrix:
    encoded = encoder.encode(texts)
    return matrix_from_tokens(turn_ids, [ids for ids, _ in encoded], [v for _, v in encoded], encoder.vocab_size)


def token_idf(owner: np.ndarray, tok_ids: np.ndarray, n_docs: int, vocab_size: int) -> np.ndarray:
    """``log(1 + N / (df + 1))`` per vocabulary id (df = turns containing the token)."""
    pairs = np.unique(owner.astype(np.int64) * vocab_size + tok_ids)
    df = np.bincount(pairs % vocab_size, minlength=vocab_size)
    return np.log1p(max(n_docs, 1) / (df + 1.0)).astype(np.float32)


def maxsim(matrix: TokenMatrix, q_ids: np.ndarray, q_vecs: np.ndarray, use_idf: bool = True,
           exact: bool = False) -> np.ndarray:
    """Per-turn ``sum_q w_q * max_t cos(q, t)`` (w = idf or 1); turns without tokens score 0.
    Similarities come from :class:`Int8Similarity` unless ``exact`` (numpy float32)."""
    scores = np.zeros(matrix.n_turns, dtype=np.float32)
    if q_vecs.shape[0] == 0 or matrix.owner.size == 0:
        return scores
    sim = (matrix.float32 @ q_vecs.T).T if exact or not matrix.int8_ok else matrix.int8(q_vecs)   # (Q, T)
    owners, starts = matrix.groups
    best = np.maximum.reduceat(sim, starts, axis=1)                          # (Q, turns with tokens)
    weights = matrix.idf[q_ids] if use_idf else np.ones(q_ids.size, dtype=np.float32)
    scores[owners[starts]] = weights @ best
    return scores


def content_query_tokens(matrix: TokenMatrix, q_ids: np.ndarray, q_vecs: np.ndarray,
                         max_df: float) -> tuple[np.ndarray, np.ndarray]:
    """The query tokens found in at most a ``max_df`` fraction of the tenant's turns
    (``(df + 1) / N <= max_df``, i.e. ``idf >= log(1 + 1 / max_df)``); all tokens when none
    qualifies or ``max_df >= 1``. Dropping the frequent ones ("what", "did", "the") leaves
    their small idf weight out of the score and shrinks the MaxSim product with them."""
    if max_df >= 1.0 or q_ids.size == 0:
        return q_ids, q_vecs
    keep = matrix.idf[q_ids] >= np.float32(np.log1p(1.0 / max(max_df, 1e-9)))
    if not keep.any():
        return q_ids, q_vecs
    return q_ids[keep], q_vecs[keep]


def matrix_from_tokens(turn_ids: Sequence[str], token_ids: Sequence[np.ndarray],
                       token_vectors: Sequence[np.ndarray], vocab_size: int | None = None,
                       quantized: tuple[Sequence[np.ndarray], Sequence[np.ndarray]] | None = None) -> TokenMatrix:
    """A tenant's :class:`TokenMatrix` from per-turn content-token ids and vectors that an
    encoder pass already produced (the build keeps them per session), in ``turn_ids`` order;
    ``quantized``: per turn, its vectors' int8 rows and scales, when the build kept them."""
    owner = np.concatenate([np.full(len(ids), i, dtype=np.int32) for i, ids in enumerate(token_ids)] or
                           [np.zeros(0, dtype=np.int32)])
    tok = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in token_ids] or [np.zeros(0, dtype=np.int64)])
    parts = list(token_vectors)
    dim = next((int(v.shape[1]) for v in parts if np.ndim(v) == 2), 384)

    def vectors() -> np.ndarray:
        return np.concatenate([np.asarray(v, dtype=np.float16).reshape(-1, dim) for v in parts] or
                              [np.zeros((0, dim), np.float16)])

    if vocab_size is None:
        from memlib.embed.minilm_backend import vocab_size as minilm_vocab_size

        vocab_size = minilm_vocab_size()
    packed = None
    if quantized is not None and len(quantized[0]) == len(parts) and parts:
        rows, scales = list(quantized[0]), list(quantized[1])
        fits = all(np.shape(r) == np.shape(v) and np.shape(s) == (len(v),) for r, s, v in zip(rows, scales, parts))
        packed = (rows, scales) if fits else None  # else not the rows of these vectors: quantized when first used
    return TokenMatrix(tuple(turn_ids), owner, vectors, token_idf(owner, tok, len(turn_ids), vocab_size), packed, dim)


def matrix_from_kept(turn_ids: Sequence[str], kept: Any, vocab_size: int | None = None) -> TokenMatrix:
    """A tenant's :class:`TokenMatrix` from its kept token arrays joined in turn order
    (:class:`memlib.compose.kept_tokens.KeptTokens`): the same matrix :func:`matrix_from_tokens`
    makes of them turn by turn."""
    if vocab_size is None:
        from memlib.embed.minilm_backend import vocab_size as minilm_vocab_size

        vocab_size = minilm_vocab_size()
    owner = np.repeat(np.arange(len(turn_ids), dtype=np.int32), kept.counts)
    idf = token_idf(owner, kept.token_ids.astype(np.int64), len(turn_ids), vocab_size)
    return TokenMatrix(tuple(turn_ids), owner, kept.vectors, idf, (kept.int8_rows, kept.scales, kept.int8t), 384)
