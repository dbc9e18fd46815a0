"""20 % injected faults over a few LoCoMo sessions: the run completes, every failure is in
llm_calls, no unit is lost, and a rerun with a healthy server calls exactly the failed units."""
import polars as pl

from memlib.config import Backend
from memlib.extract.base import Extraction, ExtractionContext, get_extractor
from memlib.extract.llm_common import CLIENT_KEY, make_units
from memlib.llm.client import LLMClient
from memlib.llm.limiter import NoLimit
from memlib.llm.models import Task
from tests.llm.conftest import llm_config


def _run(srv, turns, cache, stage):
    cfg = llm_config(srv.url, max_retries=0, turns_per_call=6, concurrency=4)
    client = LLMClient(cfg.llm, cache_dir=cache, limiter=NoLimit(), seed=3)
    ctx = ExtractionContext(turns=turns, config=cfg, extras={CLIENT_KEY: client})
    res = get_extractor(stage, Backend.LLM).run(ctx)
    return res, pl.from_arrow(client.calls_table()), cfg


def test_faults_recorded_no_unit_lost_and_rerun_fills_failed(fake_server, few_sessions, tmp_path):
    srv = fake_server(fault_rate=0.2, seed=7, delay_s=0.8)
    res, calls, cfg = _run(srv, few_sessions, tmp_path / "cache", Extraction.TRIPLETS)
    units = make_units(few_sessions, cfg.llm.turns_per_call, Task.TRIPLETS)
    assert calls.height == len(units) == calls["unit_id"].n_unique()
    failed = calls.filter(pl.col("status") == "error")
    assert 0 < failed.height < calls.height
    # every injected fault is one recorded failed attempt (wrong-schema faults may be repaired)
    recorded = sum(e.count("attempt ") for e in calls["error"].drop_nulls())
    assert recorded == len(srv.state.injected)
    # no unit lost: every unit produced nodes, from the model or from the heuristic fallback
    nodes = pl.from_arrow(res.nodes)
    fb = nodes.filter(pl.col("source") == "heuristic-fallback")
    assert fb.height > 0 and nodes.filter(pl.col("source") == cfg.llm.model).height > 0
    failed_turns = {t for u in units if u.unit_id in set(failed["unit_id"]) for t in u.turn_node_ids}
    fb_turns = set(fb.explode("provenance")["provenance"].drop_nulls())
    assert fb_turns and fb_turns <= failed_turns
    assert nodes.filter(pl.col("source") == cfg.llm.model)["prompt_version"].str.starts_with("triplets@v").all()

    # rerun against a healthy server: HTTP only for the failed units, the rest from the cache
    srv.state.fault_rate = 0.0
    before = srv.state.chat_requests
    res2, calls2, _ = _run(srv, few_sessions, tmp_path / "cache", Extraction.TRIPLETS)
    assert srv.state.chat_requests - before == failed.height
    assert set(calls2.filter(pl.col("status") == "ok")["unit_id"]) == set(failed["unit_id"])
    assert calls2.filter(pl.col("status") == "error").height == 0
    assert pl.from_arrow(res2.nodes).filter(pl.col("source") == "heuristic-fallback").height == 0

    # unchanged rerun: zero HTTP calls
    before = srv.state.chat_requests
    _, calls3, _ = _run(srv, few_sessions, tmp_path / "cache", Extraction.TRIPLETS)
    assert srv.state.chat_requests == before and set(calls3["status"]) == {"cached"}


def test_facts_stage_with_faults_completes_and_supersedes(fake_server, few_sessions, tmp_path):
    srv = fake_server(fault_rate=0.2, seed=11, delay_s=0.8)
    res, calls, cfg = _run(srv, few_sessions, tmp_path / "cache", Extraction.FACTS)
    nodes = pl.from_arrow(res.nodes)
    facts = nodes.filter(pl.col("kind") == "fact")
    assert facts.height > 0 and set(calls["task"]) >= {"facts"}
    assert set(facts["source"]) <= {cfg.llm.model, "heuristic-fallback"}
    edges = pl.from_arrow(res.edges)
    assert {"DERIVED_FROM", "ABOUT_CONCEPT", "HAS_CONCEPT"} <= set(edges["kind"])
    recorded = sum(e.count("attempt ") for e in calls["error"].drop_nulls())
    assert recorded == len(srv.state.injected)
