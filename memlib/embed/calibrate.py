"""Measure an embedder's similarity floor: where its cosines of unrelated-but-nearby texts sit,
against the default encoder's (memlib.embed.space, docs/decisions/0010-similarity-floors.md).

The build's cosine thresholds (clue merge, SIMILAR edges) are stated on the default encoder's
scale and applied as ``floor + t * (1 - floor)`` for another embedder. The floor is the one that
maps the default's upper tail of same-conversation turn pairs onto the embedder's: at each of
the quantiles :data:`QUANTILES` (the tail where the thresholds act),
``(q_embedder - q_default) / (1 - q_default)``. The floor to set is the median of the three,
rounded to two decimals and never below 0 (an embedder that spreads such pairs at least as low as
the default needs no move). This is how the floors of memlib's own backends were measured.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from memlib.config import EmbedConfig
from memlib.embed.base import EmbedError

QUANTILES = (0.99, 0.999, 0.9999)
MIN_PAIRS = 10_000  # enough same-conversation pairs for a 0.9999 quantile to mean something


def pair_cosines(vectors: np.ndarray, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """Cosines of every pair of rows within each group (rows of ``vectors`` by index), pooled."""
    out = []
    for idx in groups:
        if len(idx) < 2:
            continue
        v = np.asarray(vectors[list(idx)], dtype=np.float64)
        v = v / np.clip(np.linalg.norm(v, axis=1, keepdims=True), 1e-12, None)
        sims = v @ v.T
        out.append(sims[np.triu_indices(len(idx), k=1)])
    return np.concatenate(out) if out else np.zeros(0)


def floor_at_quantiles(q_embedder: Sequence[float], q_default: Sequence[float]) -> list[float]:
    return [(float(b) - float(d)) / (1.0 - float(d)) for b, d in zip(q_embedder, q_default)]


def chosen_floor(floors: Sequence[float]) -> float:
    return max(0.0, round(float(np.median(floors)), 2))


def measure_floor(texts: Sequence[str], groups: Sequence[Sequence[int]], embed: EmbedConfig,
                  reference: EmbedConfig | None = None) -> dict[str, Any]:
    """The similarity floor of ``embed``'s embedder over ``texts`` (turn texts), pairs taken within
    each of ``groups`` (a conversation's turn indices), against ``reference`` (default: the
    default backend)."""
    from memlib.embed.registry import config_for, get_embedder

    n_pairs = sum(len(g) * (len(g) - 1) // 2 for g in groups)
    if n_pairs < MIN_PAIRS:
        raise EmbedError(f"{n_pairs} same-conversation turn pairs; at least {MIN_PAIRS} are needed to measure the "
                         f"upper tail (quantile {QUANTILES[-1]}): give an input with more or longer conversations")
    reference = reference or config_for(EmbedConfig().backend)
    quantiles = {}
    for name, cfg in (("embedder", embed), ("default", reference)):
        vectors = get_embedder(cfg).embed_passages(list(texts))
        quantiles[name] = [float(q) for q in np.quantile(pair_cosines(vectors, groups), QUANTILES)]
    floors = floor_at_quantiles(quantiles["embedder"], quantiles["default"])
    floor = chosen_floor(floors)
    from memlib.embed.space import space_of

    return {**space_of(embed.model_dump(mode="json")), "turns": len(texts), "pairs": n_pairs,
            "quantiles": list(QUANTILES), "embedder_cosines": [round(q, 4) for q in quantiles["embedder"]],
            "default_cosines": [round(q, 4) for q in quantiles["default"]],
            "floor_at_each": [round(f, 4) for f in floors], "similarity_floor": floor,
            "setting": f"embed.similarity_floor={floor}"}
