"""Any OpenAI-compatible ``/v1/embeddings`` endpoint through the openai client.

``base_url``, ``api_key`` (SecretStr, never logged or shown in errors), ``model`` and the
query/passage prefixes come from EmbedConfig. The vector size must equal ``cfg.dim``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from memlib.embed.base import Embedder, EmbedError, TextKind

if TYPE_CHECKING:
    from memlib.config import EmbedConfig

# local OpenAI-compatible servers often ignore the key but the client requires one
NO_KEY = "not-needed"


class OpenAIEmbedder(Embedder):
    name = "openai"
    query_concurrency = 8  # evaluation embeds each question in a request of its own, 8 in flight

    def __init__(self, cfg: EmbedConfig) -> None:
        super().__init__(cfg.batch_size)
        if not cfg.base_url:
            raise EmbedError("embed.backend=openai needs embed.base_url (e.g. http://localhost:8000/v1)")
        from openai import OpenAI

        self.dim = cfg.dim
        self.model = cfg.model
        self._prefix = {TextKind.QUERY: cfg.query_prefix, TextKind.PASSAGE: cfg.passage_prefix}
        key = cfg.api_key.get_secret_value() if cfg.api_key is not None else None
        self._client = OpenAI(base_url=cfg.base_url, api_key=key or NO_KEY, timeout=cfg.timeout_s, max_retries=3)
        self._base_url = cfg.base_url

    def _encode(self, texts: list[str], kind: TextKind) -> np.ndarray:
        from openai import OpenAIError

        prefix = self._prefix[kind]
        try:
            response = self._client.embeddings.create(model=self.model, input=[prefix + t for t in texts],
                                                      encoding_format="float")
        except OpenAIError as exc:
            raise EmbedError(f"embedding request to {self._base_url} (model {self.model}) failed: "
                             f"{type(exc).__name__}: {exc}") from exc
        rows = sorted(response.data, key=lambda d: d.index)
        if len(rows) != len(texts):
            raise EmbedError(f"{self._base_url} returned {len(rows)} embeddings for {len(texts)} inputs")
        vectors = np.asarray([r.embedding for r in rows], dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise EmbedError(f"model {self.model} at {self._base_url} returns vectors of size "
                             f"{vectors.shape[-1] if vectors.ndim == 2 else '?'}, but embed.dim={self.dim}; "
                             "set embed.dim to the model's size")
        return vectors
