"""The scale corpus composer (fast) and `memlib bench scale` at a small size (slow)."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.jobs.conftest import run_cli


@pytest.fixture(scope="module")
def pool(shared_data):
    from memlib.scale.haystack import Pool

    return Pool.load(shared_data / "locomo_dev3.json",
                     [shared_data / "longmemeval_s_dev24.json"])


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


def test_jobs_scale_smaller_haystacks_are_prefixes_and_filler_reuse_is_counted(pool):
    from memlib.scale.haystack import HaystackSpec, compose_haystack, filler_summary

    small, _ = compose_haystack(pool, "conv-26", "h", HaystackSpec(sessions=500))
    big, _ = compose_haystack(pool, "conv-26", "h", HaystackSpec(sessions=2500))
    # every turn of the 500-session haystack is in the 2,500-session one: same ids, dates, texts
    keys = ["session_id", "turn_id", "session_time", "speaker", "text"]
    assert small.join(big, on=keys, how="anti").height == 0 and big.height > 4 * small.height
    s500, s2500 = filler_summary(pool, "conv-26", HaystackSpec(sessions=500)), \
        filler_summary(pool, "conv-26", HaystackSpec(sessions=2500))
    pool_sessions = s500["filler_pool_sessions"]
    assert 1100 < pool_sessions < 2481  # dev24's distinct sessions + conv-30 + conv-41
    assert s500["filler_copies"] == 481 and s500["filler_repeated_copies"] == 0
    # 2,481 copies of fewer sources: each source once before any twice
    assert s2500["filler_distinct_sources"] == pool_sessions
    assert s2500["filler_repeated_copies"] == 2481 - pool_sessions
    assert sum(s2500["filler_by_origin"].values()) == 2481
    assert set(s2500["filler_by_origin"]) == {"locomo", "longmemeval"}


def test_jobs_scale_many_tenants(pool, tmp_path):
    from memlib.scale.haystack import HaystackSpec, many_tenants, write_jsonl

    turns, questions = many_tenants(pool, 6, HaystackSpec())
    counts = write_jsonl(tmp_path / "many.jsonl", turns, questions)
    assert counts["tenants"] == 6 and counts["questions"] == sum(q.height for q in questions) > 0
    lines = (tmp_path / "many.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert {"tenant_id", "conversation_id", "session_id", "session_time", "turn_id", "role", "text"} <= set(first)


def test_jobs_scale_figures_per_strategy():
    from jobs.cli.bench_scale import strategy_figures

    def rows(tenant, strategy, recalls, latencies):
        return [{"tenant_id": tenant, "strategy": strategy, "group": "overall", "turn_recall@10": r,
                 "latency_ms": ms} for r, ms in zip(recalls, latencies)]

    hay = pl.DataFrame(rows("c-hay", "auto", [1.0, 0.5, 0.75], [4.0, 5.0, 9.0])
                       + rows("c-hay", "bm25", [0.5, 0.5], [1.0, 1.0]))
    alone = pl.DataFrame(rows("c", "auto", [1.0, 1.0], [2.0, 2.0]) + rows("c", "bm25", [0.5, 0.0], [1.0, 1.0]))
    auto = strategy_figures(hay, alone, "auto", "c-hay", "c")
    assert auto["recall_ratio"] == 0.75 and auto["haystack_turn_recall@10"] == 0.75
    assert auto["inprocess_p50_ms"] == 5.0 and auto["alone_inprocess_p50_ms"] == 2.0 and auto["p50_ratio"] == 2.5
    # each strategy against its own recall alone, never another strategy's rows
    assert strategy_figures(hay, alone, "bm25", "c-hay", "c")["recall_ratio"] == 2.0


def test_jobs_scale_paired_latency_interleaves_blocks(monkeypatch):
    """Both tenants answer the same questions block by block, the first tenant alternating, after
    one untimed warm-up query each; the p50s are those of the timed searches."""
    import types

    from jobs.cli import bench_scale
    from memlib.eval import runner
    from memlib.retrieve import kernels, registry, tenant_cache

    calls: list[tuple[str, str]] = []

    class Cache:
        def __init__(self, store, embedder=None):
            self.store = str(store)

        def get(self, name):
            return name

    def search(index, strategy, query, k):
        calls.append((index, query))
        return types.SimpleNamespace(latency_ms=4.0 if index == "big" else 2.0)

    class Embedder:
        def embed_queries(self, texts):
            return [[0.0] for _ in texts]

    monkeypatch.setattr(tenant_cache, "TenantCache", Cache)
    monkeypatch.setattr(kernels, "run_search", search)
    monkeypatch.setattr(registry, "get_strategy", lambda name, cfg: name)
    monkeypatch.setattr(runner, "default_embedder", lambda cfg, store=None: Embedder())
    qs = [f"q{i}" for i in range(25)]
    out = bench_scale.paired_latency(Path("h"), Path("a"), "big", "small", "auto", None, qs, block=10)
    assert calls[:2] == [("big", "q0"), ("small", "q0")]  # warm-up
    timed = calls[2:]
    assert [t for t, _ in timed] == ["big"] * 10 + ["small"] * 10 + ["small"] * 10 + ["big"] * 10 + \
        ["big"] * 5 + ["small"] * 5
    assert [q for _, q in timed if _ == "big"] == qs and [q for t, q in timed if t == "small"] == qs
    assert out["paired_p50_ratio"] == 2.0 and out["paired_queries"] == 25


@pytest.mark.slow
def test_jobs_scale_bench_small(shared_data, tmp_path):
    args = ["bench", "scale", "--data", str(shared_data), "--sessions", "40", "--num-cpus", "2",
            "--set", "embed.backend=wordllama", "--set", "embed.dim=256", "--strategies", "auto,bm25",
            "--store", str(tmp_path / "hay"), "--alone-store", str(tmp_path / "alone")]
    res = run_cli(args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["sessions"] == 40 and out["tenants"] == 1 and out["nodes"] > 0 and 0 < out["recall_ratio"] <= 1.5
    assert out["latency_source"] == "http" and out["latency_requests"] > 0
    assert 0 < out["p50_ms"] <= out["p95_ms"]
    assert set(out["by_strategy"]) == {"auto", "bm25"} and out["strategy"] == "auto" and not out["store_reused"]
    assert out["filler_file"] == "longmemeval_s_dev24.json" and out["filler_repeated_copies"] == 0
    # the kept stores are reused by the next run (no build), with the same recall
    again = run_cli(args + ["--no-http", "--no-speedup"])
    assert again.exit_code == 0, again.output
    second = json.loads(again.output.strip().splitlines()[-1])
    assert second["store_reused"] and second["build_s"] is None
    assert second["by_strategy"]["bm25"]["recall_ratio"] == out["by_strategy"]["bm25"]["recall_ratio"]
    assert second["paired_queries"] > 10 and 0 < second["paired_alone_p50_ms"] <= second["paired_alone_p95_ms"]
    assert second["paired_p50_ratio"] == round(second["paired_p50_ms"] / second["paired_alone_p50_ms"], 3) or \
        abs(second["paired_p50_ratio"] - second["paired_p50_ms"] / second["paired_alone_p50_ms"]) < 0.01
