"""`memlib build --extractor` / `--dry-run` pieces that need no Ray: overrides, recipe masking, summaries."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from jobs.cli.cmd_build import extractor_overrides, format_dry_run
from memlib.config import Backend, load_config

SAMPLE = Path(__file__).resolve().parents[2] / "memlib" / "data" / "sample_conversations.jsonl"


def test_extractor_sets_every_extraction_and_set_still_wins():
    cfg = load_config(None, extractor_overrides(Backend.LLM, ["facts.backend=heuristic"]))
    assert cfg.facts.backend is Backend.HEURISTIC
    assert cfg.triplets.backend is cfg.events.backend is cfg.reflections.backend is Backend.LLM
    assert not hasattr(cfg.segment, "backend")  # not an extraction: heuristic only
    assert extractor_overrides(None, None) == []


def test_llm_steps_follow_recipe_and_config():
    from pipelines.llm_actors import for_recipe, llm_steps

    cfg = load_config(None, extractor_overrides(Backend.LLM, ["reflections.enabled=false"]))
    assert [s.value for s in llm_steps(cfg)] == ["facts", "triplets", "events"]
    assert llm_steps(cfg, "episodes") == []
    masked = for_recipe(cfg, "episodes")
    assert masked.facts.backend is Backend.HEURISTIC and cfg.facts.backend is Backend.LLM


def test_call_summary_counts():
    from memlib import schema
    from pipelines.llm_actors import call_summary

    rows = [{"call_id": str(i), "task": "facts", "status": s, "prompt_tokens": 10, "completion_tokens": 3}
            for i, s in enumerate(["ok", "ok", "cached", "error"])]
    got = call_summary(schema.conform(pa.Table.from_pylist(rows), schema.LLM_CALLS))
    assert got == {"calls": 4, "prompt_tokens": 40, "completion_tokens": 12, "ok": 2, "cached": 1, "error": 1}
    assert call_summary(None) == {}


def test_dry_run_input_plans_without_sending(tmp_path):
    from pipelines.llm_actors import dry_run_input

    cfg = load_config(None, extractor_overrides(Backend.LLM, ["llm.base_url=http://127.0.0.1:9/v1"]))
    est = dry_run_input(cfg, SAMPLE, "jsonl", "full")
    assert est["tenants"] == 4 and est["calls"] > 0
    assert {"facts", "triplets", "events"} <= set(est["by_task"])
    assert est["input_tokens"] > est["output_tokens"] > 0
    text = format_dry_run(est)
    assert "total" in text and "est. cost $" in text
    # the episodes recipe has no extraction stage: nothing to call
    assert dry_run_input(cfg, SAMPLE, "jsonl", "episodes")["calls"] == 0
    heuristic = load_config(None, extractor_overrides(Backend.HEURISTIC, None))
    assert dry_run_input(heuristic, SAMPLE, "jsonl", "full")["calls"] == 0
