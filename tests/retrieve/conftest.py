"""Retrieve fixtures: one store built by `memlib build` (wordllama embeddings, fast) from
memlib/data/sample_conversations.jsonl, and a TenantCache over it."""
from __future__ import annotations

from pathlib import Path

import pytest

from memlib.config import MemlibConfig
from memlib.embed import get_embedder
from memlib.embed.registry import config_for

SAMPLE = Path(__file__).resolve().parents[2] / "memlib" / "data" / "sample_conversations.jsonl"
EMBED_SETS = ["--set", "embed.backend=wordllama", "--set", "embed.dim=256",
              "--set", "retrieve.precompute_token_matrices=true"]


def retrieve_config() -> MemlibConfig:
    cfg = MemlibConfig()
    cfg.embed = config_for("wordllama", cfg.embed)
    return cfg


@pytest.fixture(scope="session")
def sample_store(ray_local, tmp_path_factory) -> Path:
    from typer.testing import CliRunner

    from jobs.cli import app

    out = tmp_path_factory.mktemp("retrieve_store") / "store"
    res = CliRunner().invoke(app, ["build", "--input", str(SAMPLE), "--format", "jsonl", "--out", str(out),
                                   "--num-cpus", "2", *EMBED_SETS])
    assert res.exit_code == 0, res.output + repr(res.exception)
    return out


@pytest.fixture(scope="session")
def cache(sample_store):
    from memlib.retrieve.tenant_cache import TenantCache

    return TenantCache(sample_store, embedder=get_embedder(retrieve_config().embed))
