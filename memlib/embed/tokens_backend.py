"""``minilm-tokens``: passage and query vectors from ``auto``'s token encoder, in one pass.

A text's vector is the L2-normalized mean of its content-token vectors from the int8
all-MiniLM-L6-v2 token encoder that ``auto`` scores with (memlib/embed/token_encoder.py; texts over
128 tokens read by windows, every content token once; special and punctuation tokens dropped;
the mean is over the text's first window). The build encodes every turn once and keeps both
outputs of that pass: the token vectors (``auto``'s token matrix) and their first window's mean
(the turn's passage vector, which every vector strategy reads). Measured against the other backends in
docs/decisions/0007-default-embedder.md.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from memlib.embed.base import Embedder, TextKind

DIM = 384


def pooled(token_vectors: list[np.ndarray], dim: int = DIM, heads: list[int] | None = None) -> np.ndarray:
    """(n, dim) unit vectors: the mean of each text's token vectors (a text with none gets zeros);
    with ``heads``, of its first ``heads[i]`` token vectors only.

    The build pools a turn's first window's own share (``TokenEncoder.encode_with_heads``); ``auto``
    reads every token from the token matrix. On longmemeval_s_dev24
    (docs/decisions/0006-windowed-token-encoder.md), with each turn encoded on its own as the build
    does, neither the whole first window (its overlap with the second included) nor every window's
    rows did better for ``dense`` and ``hybrid``: their moves against the batch-encoded store of
    9603941 are evidence turns one rank either side of the cut-off, set by the int8 encoder's
    per-batch quantization."""
    out = np.zeros((len(token_vectors), dim), dtype=np.float32)
    for i, v in enumerate(token_vectors):
        if heads is not None:
            v = v[:max(int(heads[i]), 1)]
        if len(v):
            out[i] = np.asarray(v, dtype=np.float32).mean(axis=0)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norms, 1e-12)


class MiniLMTokensEmbedder(Embedder):
    name = "minilm-tokens"
    dim = DIM

    def __init__(self, batch_size: int = 64, threads: int | None = None, model: str | None = None,
                 model_cache: str | Path | None = None) -> None:
        super().__init__(batch_size)
        from memlib.embed import token_encoder, token_model

        self.encoder = token_encoder.get_encoder(threads, model or token_model.DEFAULT_MODEL, model_cache)

    def _encode(self, texts: list[str], kind: TextKind) -> np.ndarray:
        encoded, heads = self.encoder.encode_with_heads(texts)
        return pooled([vec for _, vec in encoded], heads=heads)


class ContentTokenizer:
    """Content-token ids of texts as ``auto``'s token encoder keeps them (WordPiece, special and
    punctuation tokens dropped), without running the model; cut at 128 tokens, as the encoder's
    first window (the build matches derived node texts, most of them short, against turns)."""

    def __init__(self) -> None:
        from memlib.embed import token_encoder
        from memlib.embed.minilm_backend import load_tokenizer

        self._tok = load_tokenizer(token_encoder.MAX_TOKENS)
        self._tok.no_padding()
        vocab = self._tok.get_vocab()
        self._drop = np.zeros(max(vocab.values()) + 1, dtype=bool)
        for tok, i in vocab.items():
            self._drop[i] = tok in token_encoder._SPECIAL or bool(token_encoder._PUNCT.match(tok))

    def ids(self, texts: list[str]) -> list[np.ndarray]:
        out = []
        for enc in self._tok.encode_batch(texts):
            ids = np.asarray(enc.ids, dtype=np.int32)
            out.append(ids[~self._drop[ids]])
        return out


@lru_cache(maxsize=1)
def content_tokenizer() -> ContentTokenizer:
    """One :class:`ContentTokenizer` per process."""
    return ContentTokenizer()
