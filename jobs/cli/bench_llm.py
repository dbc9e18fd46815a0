"""``memlib bench llm``: LLM extraction over LoCoMo sessions against the local fake
OpenAI-compatible server (realistic response sizes); prints one JSON line of per-session
calls and tokens, calls/s, and the dry-run estimate's error against the counted tokens."""
from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Annotated

import pyarrow as pa
import typer

from jobs.cli.common import ConfigOpt, SetOpt, get_config

MEMORAI_INPUT, MEMORAI_OUTPUT = 9_700, 3_600


def _kept(turns: pa.Table, cfg, gate: bool) -> frozenset[str] | None:
    if not gate:
        return None
    from memlib.text.gate import gate_flags
    return frozenset(turns.filter(gate_flags(turns, cfg.gate)).column("node_id").to_pylist())


def run_bench(path: Path, cfg, *, gate: bool = True, tenants: int | None = None) -> dict[str, object]:
    import polars as pl
    import pyarrow.compute as pc

    from memlib.compose.steps import run_extractions
    from memlib.config import Backend
    from memlib.extract.base import Extraction, ExtractionContext
    from memlib.extract.llm_plan import plan_calls
    from memlib.io.readers import read_input
    from memlib.llm.estimate import estimate
    from memlib.llm.fake_server import FakeLLMServer

    turns = read_input(path, "locomo", cfg.io).turns
    if tenants:
        keep = pl.from_arrow(turns.select(["tenant_id"]))["tenant_id"].unique(maintain_order=True)[:tenants]
        turns = turns.filter(pc.is_in(turns.column("tenant_id"), value_set=keep.to_arrow()))
    for extraction in Extraction:
        getattr(cfg, extraction.value).backend = Backend.LLM
    kept = _kept(turns, cfg, gate)
    n_sessions = pl.from_arrow(turns.select(["tenant_id", "session_id"])).unique().height
    with FakeLLMServer() as srv, tempfile.TemporaryDirectory() as cache:
        cfg.llm.base_url = srv.url
        ctx = ExtractionContext(turns=turns, kept_turn_ids=kept, config=cfg, extras={"llm_cache_dir": cache})
        est = estimate(plan_calls(ctx), cfg.llm)
        t0 = time.perf_counter()
        run_extractions(ctx)
        elapsed = time.perf_counter() - t0
        calls = pl.from_arrow(ctx.extras["llm_client"].calls_table())
    pt, ct = int(calls["prompt_tokens"].sum()), int(calls["completion_tokens"].sum())
    by_task = (calls.group_by("task").agg(pl.len().alias("calls"), pl.col("prompt_tokens").sum(),
                                          pl.col("completion_tokens").sum()).sort("task"))
    return {
        "sessions": n_sessions, "gate": gate, "turns_per_call": cfg.llm.turns_per_call,
        "calls_per_session": round(calls.height / n_sessions, 2),
        "prompt_tokens_per_session": round(pt / n_sessions, 1),
        "completion_tokens_per_session": round(ct / n_sessions, 1),
        "tokens_per_session": round((pt + ct) / n_sessions, 1),
        "share_of_memorai": round((pt + ct) / n_sessions / (MEMORAI_INPUT + MEMORAI_OUTPUT), 3),
        "calls_per_s": round(calls.height / elapsed, 1),
        "dry_run": {"calls": est.calls, "input_tokens": est.input_tokens, "output_tokens": est.output_tokens,
                    "cost_usd": round(est.cost, 4),
                    "input_error": round(est.input_tokens / max(pt, 1) - 1, 3),
                    "output_error": round(est.output_tokens / max(ct, 1) - 1, 3)},
        "per_task_per_session": {r["task"]: {"calls": round(r["calls"] / n_sessions, 2),
                                             "prompt": round(r["prompt_tokens"] / n_sessions),
                                             "completion": round(r["completion_tokens"] / n_sessions)}
                                 for r in by_task.iter_rows(named=True)},
    }


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("llm")
    def bench_llm(
        data: Annotated[Path, typer.Option(help="LoCoMo JSON file")] = Path("../shared/data/locomo_dev3.json"),
        gate: Annotated[bool, typer.Option(help="extract only turns kept by the memory gate")] = True,
        tenants: Annotated[int, typer.Option(help="first N conversations (0: all)")] = 0,
        config: ConfigOpt = None, set_: SetOpt = None,
    ) -> None:
        """Tokens and calls per session of LLM extraction against the fake server."""
        for name in ("httpx", "httpx2", "openai"):
            logging.getLogger(name).setLevel(logging.WARNING)
        cfg = get_config(config, set_)
        cfg.llm.requests_per_minute = max(cfg.llm.requests_per_minute, 100_000)
        typer.echo(json.dumps(run_bench(data, cfg, gate=gate, tenants=tenants or None)))
