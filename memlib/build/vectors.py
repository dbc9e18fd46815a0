"""Embedding helpers of the build: every distinct text goes through the embedder once."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class PassageEmbedder(Protocol):
    dim: int

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...


class VectorCache:
    """Text -> vector, filled in batches; a text already seen is never embedded again."""

    def __init__(self, embedder: PassageEmbedder):
        self.embedder = embedder
        self.dim = int(embedder.dim)
        self._index: dict[str, int] = {}
        self._blocks: list[np.ndarray] = []
        self._matrix = np.zeros((0, self.dim), dtype=np.float32)
        self.embedded = 0  # texts actually sent to the embedder

    def add(self, texts: Sequence[str]) -> None:
        """Embed, in one batched call, the distinct texts not seen before."""
        new = [t for t in dict.fromkeys(texts) if t not in self._index]
        if not new:
            return
        vecs = np.asarray(self.embedder.embed_passages(new), dtype=np.float32)
        base = len(self._index)
        self._index.update((t, base + i) for i, t in enumerate(new))
        self._blocks.append(vecs)
        self.embedded += len(new)
        self._matrix = None  # rebuilt lazily

    def matrix(self) -> np.ndarray:
        if self._matrix is None:
            self._matrix = np.concatenate(self._blocks, axis=0) if self._blocks else \
                np.zeros((0, self.dim), dtype=np.float32)
            self._blocks = [self._matrix]
        return self._matrix

    def get(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors (len(texts), dim) of texts already added; embeds any that are missing."""
        self.add(texts)
        rows = np.fromiter((self._index[t] for t in texts), dtype=np.int64, count=len(texts))
        return self.matrix()[rows]


def embed_turns(cache: VectorCache, turns: pa.Table) -> np.ndarray:
    """Turn vectors in row order of ``turns`` (texts embedded once, duplicates shared)."""
    texts = turns.column("text").to_pylist()
    return cache.get(texts)


def with_embeddings(nodes: pa.Table, vectors: np.ndarray, dim: int) -> pa.Table:
    """``nodes`` plus a fixed-size-list ``embedding`` column built from ``vectors`` (no copy per row)."""
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), pa.float32())
    emb = pa.FixedSizeListArray.from_arrays(flat, dim)
    if "embedding" in nodes.column_names:
        nodes = nodes.drop_columns(["embedding"])
    return nodes.append_column("embedding", emb)


def embed_nodes(cache: VectorCache, nodes: pa.Table) -> pa.Table:
    """Attach an embedding to every node: all distinct texts embedded in one batched call."""
    texts = pc.fill_null(nodes.column("text"), "").to_pylist()
    return with_embeddings(nodes, cache.get(texts), cache.dim)
