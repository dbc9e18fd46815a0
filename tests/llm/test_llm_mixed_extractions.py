"""Heuristic and LLM backends mixed in one run of the build's extraction orchestration
(:func:`memlib.compose.steps.run_extractions`), both ways round, against the fake
OpenAI-compatible server over real HTTP: every derived node kind appears, every node keeps
the attributes contract of its kind, and both backends wrote nodes."""
from __future__ import annotations

import polars as pl
import pytest

from memlib.compose.steps import run_extractions
from memlib.config import Backend
from memlib.extract.base import Extraction, ExtractionContext
from memlib.extract.contract import missing_keys
from memlib.extract.llm_common import CLIENT_KEY
from memlib.llm.client import LLMClient
from memlib.llm.limiter import NoLimit
from tests.llm.conftest import llm_config

DERIVED_KINDS = {"fact", "concept", "triplet", "entity", "event", "reflection"}
H, L = Backend.HEURISTIC, Backend.LLM
MIXES = {
    "llm facts and events": {Extraction.FACTS: L, Extraction.TRIPLETS: H, Extraction.EVENTS: L,
                             Extraction.REFLECTIONS: H},
    "llm triplets and reflections": {Extraction.FACTS: H, Extraction.TRIPLETS: L, Extraction.EVENTS: H,
                                     Extraction.REFLECTIONS: L},
}


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_mixed_backends_produce_every_node_kind(mix, fake_server, few_sessions, tmp_path):
    srv = fake_server()
    cfg = llm_config(srv.url, concurrency=4)
    cfg.reflections.min_facts, cfg.reflections.min_sessions = 1, 1
    for extraction, backend in MIXES[mix].items():
        getattr(cfg, extraction.value).backend = backend
    client = LLMClient(cfg.llm, cache_dir=tmp_path / "cache", limiter=NoLimit())
    res = run_extractions(ExtractionContext(turns=few_sessions, config=cfg, extras={CLIENT_KEY: client}))
    nodes = pl.from_arrow(res.nodes.select(["node_id", "kind", "source"]))
    kinds = set(nodes["kind"].unique())
    assert DERIVED_KINDS <= kinds, DERIVED_KINDS - kinds
    assert missing_keys(res.nodes) == {}
    assert srv.state.chat_requests > 0
    sources = set(nodes["source"].unique())
    assert "heuristic" in sources and cfg.llm.model in sources, sources
    # every LLM-backed extraction wrote nodes from the model, every heuristic one without it
    llm_kinds = set(nodes.filter(pl.col("source") == cfg.llm.model)["kind"].unique())
    wanted = {Extraction.FACTS: "fact", Extraction.TRIPLETS: "triplet", Extraction.EVENTS: "event",
              Extraction.REFLECTIONS: "reflection"}
    assert {wanted[e] for e, b in MIXES[mix].items() if b is L} <= llm_kinds
    # ids are unique: the shared id builders never give two nodes one id
    assert nodes["node_id"].n_unique() == nodes.height


def test_llm_facts_keep_at_most_max_concepts_per_turn(fake_server, few_sessions, tmp_path):
    srv = fake_server()
    cfg = llm_config(srv.url, concurrency=4)
    cfg.facts.backend = Backend.LLM
    cfg.facts.max_concepts_per_turn = 0  # the fake model names one concept per fact
    client = LLMClient(cfg.llm, cache_dir=tmp_path / "cache", limiter=NoLimit())
    from memlib.compose.steps import extract_one

    res = extract_one(ExtractionContext(turns=few_sessions, config=cfg, extras={CLIENT_KEY: client}),
                      Extraction.FACTS)
    facts = pl.from_arrow(res.nodes).filter((pl.col("kind") == "fact") & (pl.col("source") == cfg.llm.model))
    counts = facts["attributes"].str.json_decode().struct.field("concepts").list.len()
    assert facts.height > 0 and counts.max() == 0
    assert pl.from_arrow(res.nodes).filter(pl.col("kind") == "concept").height == 0
