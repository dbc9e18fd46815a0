"""``memlib bench ppr``: PPR kernel timings on synthetic memory graphs, as JSON."""
from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from jobs.cli.common import ConfigOpt, SetOpt, fail, get_config


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s.replace("_", "")) for s in text.split(",") if s.strip()]
    except ValueError:
        fail(f"--sizes must be comma-separated integers, got {text!r}")
        raise
    if not sizes or min(sizes) < 10:
        fail("--sizes needs at least one size >= 10")
    return sizes


def ppr(sizes: Annotated[str, typer.Option(help="comma-separated node counts")] = "1000,10000,100000,1000000",
        queries: Annotated[int, typer.Option(min=1, help="queries per size")] = 20,
        gt_threads: Annotated[Optional[int], typer.Option(help="graph-tool OpenMP threads (default: its own)")] = None,
        config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Per-query PPR time: scipy power iteration vs graph-tool vs networkx; query subgraphs."""
    from jobs.bench.ppr import run_benchmark

    cfg = get_config(config, set_)
    typer.echo(json.dumps(run_benchmark(_sizes(sizes), queries, cfg.graph, gt_threads), indent=2))


def register(bench_app: typer.Typer) -> None:
    bench_app.command("ppr")(ppr)
