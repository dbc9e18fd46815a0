"""Mixing extraction backends: LLM facts (the fake OpenAI-compatible server over
real HTTP) with the heuristic triplets, events and reflections. Both fact backends fill one
attributes contract, so the heuristic events and reflections find what they read in LLM facts and
every node kind appears."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from memlib.extract.contract import FACT_KEYS, missing_keys
from memlib.llm.fake_server import FakeLLMServer
from tests.jobs.conftest import run_cli

pytestmark = pytest.mark.ray
SAMPLE = Path(__file__).resolve().parents[2] / "memlib" / "data" / "sample_conversations.jsonl"
KINDS = {"turn", "segment", "session", "clue", "concept", "fact", "reflection", "entity", "event", "triplet"}


def test_llm_facts_with_heuristic_events_and_reflections(ray_local, tmp_path):
    store = tmp_path / "store"
    with FakeLLMServer() as srv:
        sets = {"facts.backend": "llm", "llm.base_url": srv.url, "llm.api_key": "sk-test-secret",
                "llm.max_retries": "0", "llm.timeout_s": "5", "llm.requests_per_minute": "100000",
                "reflections.min_facts": "1", "reflections.min_sessions": "1",
                "embed.backend": "wordllama"}
        args = ["build", "--input", str(SAMPLE), "--format", "jsonl", "--out", str(store), "--num-cpus", "2"]
        for k, v in sets.items():
            args += ["--set", f"{k}={v}"]
        res = run_cli(args)
        assert res.exit_code == 0, res.output[-3000:] + repr(res.exception)
        assert srv.state.chat_requests > 0
    from memlib.io.store import StoreReader

    nodes = StoreReader(store).nodes(columns=["node_id", "kind", "text", "attributes", "source"])
    df = pl.from_arrow(nodes)
    kinds = set(df["kind"].unique().to_list())
    assert KINDS <= kinds, KINDS - kinds
    facts = df.filter(pl.col("kind") == "fact")
    assert facts["source"].unique().to_list() != ["heuristic"], "the facts came from the LLM backend"
    assert missing_keys(nodes) == {}
    llm_facts = facts.filter(pl.col("source") != "heuristic")
    assert llm_facts.height and all(json.loads(a)["speaker"] for a in llm_facts["attributes"])
    assert set(FACT_KEYS) <= set(json.loads(llm_facts["attributes"][0]))
    m = json.loads((store / "manifest.json").read_text())
    assert m["nodes_by_kind"]["reflection"] > 0 and m["nodes_by_kind"]["event"] > 0
