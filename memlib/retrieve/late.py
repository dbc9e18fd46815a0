"""Token-level late interaction (MaxSim) over a small encoder's token vectors.

A turn is scored by ``sum_q idf(q) * max_t cos(q, t)`` over the query's content tokens ``q``
and the turn's content tokens ``t`` (special and punctuation tokens dropped); ``idf`` is
computed over the tenant's turns. A tenant's tokens are one :class:`TokenMatrix`. The parts
around it live beside this module: which encoder (:mod:`memlib.retrieve.token_model`), the
encoder (:mod:`memlib.retrieve.token_encoder`), the int8 similarity kernel
(:mod:`memlib.retrieve.int8_maxsim`; ``exact=True`` keeps numpy float32) and the per-tenant
matrix cache in memory and on disk (:mod:`memlib.retrieve.matrix_cache`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Sequence

import numpy as np

from memlib.retrieve.int8_maxsim import INT8_MAX_VALUES, Int8Similarity, transposed

if TYPE_CHECKING:
    from memlib.retrieve.token_encoder import TokenEncoder


@dataclass(frozen=True, eq=False)
class TokenMatrix:
    """All content tokens of a tenant's turns: ``vectors[i]`` belongs to turn ``owner[i]``
    (turn position in ``turn_ids``); ``idf`` per vocabulary id over those turns."""

    turn_ids: tuple[str, ...]   # turn node ids, conversation order
    owner: np.ndarray           # (T,) int32
    vectors: np.ndarray         # (T, dim) float16: as stored on disk, half the memory of float32
    idf: np.ndarray             # (vocab,) float32
    # the vectors' int8 rows (T, dim) and scales (T,) as the build kept them, when it did: the int8
    # kernel then takes them instead of quantizing the tenant at its first query
    quantized: tuple[np.ndarray, np.ndarray] | None = None

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
        return 0 < self.vectors.size <= INT8_MAX_VALUES

    @cached_property
    def int8(self) -> Int8Similarity:
        if self.quantized is None:
            return Int8Similarity(self.vectors)
        v8, scale = self.quantized
        return Int8Similarity(quantized=(scale, transposed(v8)))

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
    if q_vecs.shape[0] == 0 or matrix.vectors.shape[0] == 0:
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
    vectors = np.concatenate([np.asarray(v, dtype=np.float16) for v in token_vectors] or
                             [np.zeros((0, 384), np.float16)])
    if vocab_size is None:
        from memlib.embed.minilm_backend import vocab_size as minilm_vocab_size

        vocab_size = minilm_vocab_size()
    vocab = vocab_size
    packed = None
    if quantized is not None and len(quantized[0]):
        packed = (np.concatenate([np.asarray(v, np.int8) for v in quantized[0]]),
                  np.concatenate([np.asarray(s, np.float32) for s in quantized[1]]))
        if packed[0].shape != vectors.shape or packed[1].shape != (vectors.shape[0],):
            packed = None  # not the rows of these vectors: quantized at the first query instead
    return TokenMatrix(tuple(turn_ids), owner, vectors, token_idf(owner, tok, len(turn_ids), vocab), packed)
