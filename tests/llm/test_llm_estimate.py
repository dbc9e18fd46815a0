"""The dry-run estimate is within 20 % of the tokens counted by the server's tokenizer."""
import polars as pl
import pyarrow.compute as pc

from memlib.compose.steps import run_extractions
from memlib.config import Backend
from memlib.extract.base import ExtractionContext
from memlib.extract.llm_common import CLIENT_KEY
from memlib.extract.llm_plan import plan_calls
from memlib.llm.client import LLMClient
from memlib.llm.estimate import estimate
from memlib.llm.limiter import NoLimit
from memlib.text.gate import gate_flags
from tests.llm.conftest import llm_config


def test_dry_run_within_20_percent(fake_server, locomo_turns, tmp_path):
    first = locomo_turns.column("tenant_id")[0]
    turns = locomo_turns.filter(pc.equal(locomo_turns.column("tenant_id"), first))
    srv = fake_server()
    cfg = llm_config(srv.url, concurrency=4)
    for section in (cfg.facts, cfg.triplets, cfg.events, cfg.reflections):
        section.backend = Backend.LLM
    kept = frozenset(turns.filter(gate_flags(turns, cfg.gate)).column("node_id").to_pylist())
    client = LLMClient(cfg.llm, cache_dir=tmp_path / "c", limiter=NoLimit())
    ctx = ExtractionContext(turns=turns, kept_turn_ids=kept, config=cfg, extras={CLIENT_KEY: client})
    est = estimate(plan_calls(ctx), cfg.llm)
    assert srv.state.requests == 0  # planning sends nothing
    res = run_extractions(ctx)
    calls = pl.from_arrow(client.calls_table())
    assert res.nodes.num_rows > 0 and set(calls["status"]) == {"ok"}
    pt, ct = calls["prompt_tokens"].sum(), calls["completion_tokens"].sum()
    assert pt == srv.state.prompt_tokens and ct == srv.state.completion_tokens
    assert abs(est.input_tokens / pt - 1) <= 0.2, (est.input_tokens, pt)
    assert abs(est.output_tokens / ct - 1) <= 0.2, (est.output_tokens, ct)
    assert abs(est.calls / calls.height - 1) <= 0.2
    assert est.cost > 0
