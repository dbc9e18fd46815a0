"""Which settings decide what a build writes: marked on the config fields themselves
(``config.RUNTIME``), read by the nightly build key; dead settings and prompts are gone."""
from __future__ import annotations

import pytest

from memlib.compose.keys import build_key
from memlib.config import ConfigError, MemlibConfig, load_config
from memlib.llm.models import Task
from memlib.llm.prompts import DEFAULT_DIR

PROMPTS = {"facts": "h1"}  # fixed prompt hashes: the key then depends on the config alone


def _key(*overrides: str) -> str:
    return build_key(load_config(None, list(overrides)), "full", PROMPTS)


@pytest.mark.parametrize("override", ["io.staging_dir=/tmp/stage", "embed.model_cache=/tmp/models",
                                      "embed.threads=3", "llm.concurrency=9", "retrieve.k=7", "ray.block_turns=9"])
def test_settings_without_output_effect_keep_the_build_key(override):
    assert _key(override) == _key()


@pytest.mark.parametrize("override", ["segment.window=3", "facts.max_concepts_per_turn=2", "embed.dim=384",
                                      "llm.model=other", "io.max_turn_chars=100",
                                      "retrieve.precompute_token_matrices=false"])
def test_settings_with_output_effect_change_the_build_key(override):
    if override == "embed.dim=384":
        override = "embed.backend=wordllama"  # dim follows the backend
    assert _key(override) != _key()


def test_output_snapshot_leaves_out_runtime_fields_and_post_build_sections():
    snap = MemlibConfig().output_snapshot()
    assert "staging_dir" not in snap["io"] and "model_cache" not in snap["embed"]
    assert "api_key" not in snap["llm"] and "model" in snap["llm"]
    assert not {"eval", "serve", "nightly", "ray"} & set(snap)
    # of the retrieval settings only the one that makes the build write token matrices
    assert snap["retrieve"] == {"precompute_token_matrices": True}


def test_heuristic_only_sections_reject_an_llm_backend():
    assert load_config(None, ["segment.backend=heuristic"]).segment.model_dump() == MemlibConfig().segment.model_dump()
    for section in ("segment", "gate", "clues"):
        with pytest.raises(ConfigError, match="only the heuristic implementation"):
            load_config(None, [f"{section}.backend=llm"])


def test_every_prompt_file_belongs_to_a_task():
    assert {p.stem for p in DEFAULT_DIR.glob("*.txt")} == {t.value for t in Task}


def test_the_build_format_is_part_of_the_build_key(monkeypatch):
    """A code change that changes what a build writes raises BUILD_FORMAT: carried-over tenants
    would otherwise keep output of the old code (same input, same config)."""
    from memlib.compose import keys as nightly_plan

    before = _key()
    monkeypatch.setattr(nightly_plan, "BUILD_FORMAT", nightly_plan.BUILD_FORMAT + 1)
    assert _key() != before
