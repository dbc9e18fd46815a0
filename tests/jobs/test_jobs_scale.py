"""The scale corpus composer (fast) and `memlib bench scale` at a small size (slow)."""
from __future__ import annotations

import json

import polars as pl
import pytest

from tests.jobs.conftest import run_cli


@pytest.fixture(scope="module")
def pool(shared_data):
    from memlib.scale.haystack import Pool

    return Pool.load(shared_data / "locomo_dev3.json",
                     [shared_data / "longmemeval_s_3haystacks_thirdparty_modified.json"])


def test_jobs_scale_haystack_is_longmemeval_l_sized_and_keeps_evidence(pool):
    from memlib.scale.haystack import HaystackSpec, compose_haystack

    turns, questions = compose_haystack(pool, "conv-26", "conv-26-hay", HaystackSpec())
    assert turns.select("conversation_id", "session_id").n_unique() == 2500
    assert 20_000 <= turns.height <= 40_000
    own = pool.turns.filter(pl.col("conversation_id") == "conv-26")
    kept = turns.filter(pl.col("conversation_id") == "conv-26")
    assert kept.select("session_id", "turn_id", "text").equals(own.select("session_id", "turn_id", "text"))
    evidence = set(questions.get_column("evidence").explode().drop_nulls().to_list())
    kept_ids, own_ids = set(kept.get_column("turn_id").to_list()), set(own.get_column("turn_id").to_list())
    # every evidence id valid in the source stays valid (LoCoMo has a few malformed ids, e.g. 'D8:6; D9:17')
    assert evidence & own_ids == evidence & kept_ids and len(evidence & kept_ids) >= 0.95 * len(evidence)
    assert turns.select("conversation_id", "turn_id").is_unique().all()
    distractors = turns.filter(pl.col("conversation_id") != "conv-26")
    # never a copy of the evaluated conversation's own sessions, never its speakers' names
    assert not set(distractors.get_column("text").to_list()) & set(own.get_column("text").to_list())
    names = set(own.get_column("speaker").unique().to_list())
    assert not names & set(distractors.get_column("speaker").unique().to_list())
    # re-dated: the copies are spread over many days, not the source dates
    assert distractors.get_column("session_time").dt.date().n_unique() > 300


def test_jobs_scale_many_tenants(pool, tmp_path):
    from memlib.scale.haystack import HaystackSpec, many_tenants, write_jsonl

    turns, questions = many_tenants(pool, 6, HaystackSpec())
    counts = write_jsonl(tmp_path / "many.jsonl", turns, questions)
    assert counts["tenants"] == 6 and counts["questions"] == sum(q.height for q in questions) > 0
    lines = (tmp_path / "many.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert {"tenant_id", "conversation_id", "session_id", "session_time", "turn_id", "role", "text"} <= set(first)


@pytest.mark.slow
def test_jobs_scale_bench_small(shared_data):
    res = run_cli(["bench", "scale", "--data", str(shared_data), "--sessions", "40", "--num-cpus", "2",
                   "--set", "embed.backend=wordllama", "--set", "embed.dim=256"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["sessions"] == 40 and out["tenants"] == 1 and out["nodes"] > 0 and 0 < out["recall_ratio"] <= 1.5
    assert out["latency_source"] == "http" and out["latency_requests"] > 0
    assert 0 < out["p50_ms"] <= out["p95_ms"]
