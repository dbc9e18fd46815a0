"""``minilm-tokens``: passage and query vectors from ``auto``'s token encoder, in one pass.

A text's vector is the L2-normalized mean of its content-token vectors from the int8
all-MiniLM-L6-v2 token encoder that ``auto`` scores with (memlib/retrieve/token_encoder.py; texts over
128 tokens read by windows, every content token once; special and punctuation tokens dropped;
the mean is over every content token of the text's first window). The build encodes every turn
once and keeps both outputs of that pass: the token vectors (``auto``'s token matrix) and the
first window's mean (the turn's passage vector, which every vector strategy reads). Measured
against the other backends in docs/benchmarks.md ("Embedding at the floor").
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from memlib.embed.base import Embedder, TextKind

DIM = 384


def unit_rows(vectors: list[np.ndarray], dim: int = DIM) -> np.ndarray:
    """(n, dim): ``vectors`` stacked, each scaled to unit length (zero rows stay zero).

    The passage vector of a text is its head (``TokenEncoder.encode_with_heads``): the mean of
    every content-token vector of its first window, so the same as the truncating encoder's
    mean. Measured on longmemeval_s_dev24 (docs/benchmarks.md): the mean over every window of a
    long turn lowered ``dense`` turn R@10; the first window's own share of rows (its first 110
    content tokens) instead of its every row lowered ``hybrid`` turn R@5 by one question. ``auto``
    reads every token from the token matrix."""
    out = np.zeros((len(vectors), dim), dtype=np.float32)
    for i, v in enumerate(vectors):
        out[i] = v
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norms, 1e-12)


class MiniLMTokensEmbedder(Embedder):
    name = "minilm-tokens"
    dim = DIM

    def __init__(self, batch_size: int = 64, threads: int | None = None, model: str | None = None,
                 model_cache: str | Path | None = None) -> None:
        super().__init__(batch_size)
        from memlib.retrieve import token_encoder, token_model

        self.encoder = token_encoder.get_encoder(threads, model or token_model.DEFAULT_MODEL, model_cache)

    def _encode(self, texts: list[str], kind: TextKind) -> np.ndarray:
        _, heads = self.encoder.encode_with_heads(texts)
        return unit_rows(heads)


class ContentTokenizer:
    """Content-token ids of texts as ``auto``'s token encoder keeps them (WordPiece, special and
    punctuation tokens dropped), without running the model; cut at 128 tokens, as the encoder's
    first window (the build matches derived node texts, most of them short, against turns)."""

    def __init__(self) -> None:
        from memlib.embed.minilm_backend import load_tokenizer
        from memlib.retrieve import token_encoder

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
