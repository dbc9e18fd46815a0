"""``memlib query``: retrieve for one question and print the packed context with provenance."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.common import DEFAULTS, STRATEGY_NAMES, ConfigOpt, SetOpt, default_note, fail, get_config, one_line


def _fmt_time(t) -> str:
    """A turn's session time as stored: converted to UTC at read time, and labelled so."""
    return t.strftime("%Y-%m-%d %H:%M UTC") if t is not None else "?"


def ranked_turn_lines(turns, limit: int | None = None, evidence: frozenset[str] = frozenset()) -> list[str]:
    """One line per ranked turn: rank, turn id (``*`` marks an evidence turn), session, time, text."""
    return [f"{i:3d}. {('*' if t.turn_id in evidence else ' ')}{t.turn_id:<10} {t.session_id:<14} "
            f"{_fmt_time(t.time)}  {t.text[:100]}"
            for i, t in enumerate(turns[:limit], start=1)]


def register(app: typer.Typer) -> None:
    @app.command("query")
    def query_cmd(
        question: Annotated[str, typer.Argument(help="the question")],
        store: Annotated[Path, typer.Option("--store", "-s", help="memory store directory")],
        tenant: Annotated[str, typer.Option("--tenant", "-t", help="tenant id")],
        strategy: Annotated[Optional[str], typer.Option(
            "--strategy", help=f"{' | '.join(STRATEGY_NAMES)}; "
                               f"{default_note('retrieve.default_strategy', DEFAULTS.retrieve.default_strategy)}")]
        = None,
        k: Annotated[Optional[int], typer.Option("--k", help=f"nodes to retrieve; "
                                                 f"{default_note('retrieve.k', DEFAULTS.retrieve.k)}")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the full result as JSON")] = False,
        config: ConfigOpt = None,
        overrides: SetOpt = None,
    ) -> None:
        """Print the ranked turns (turn id, session, time) and the packed context for a question."""
        from memlib.embed.base import EmbedError
        from memlib.eval.runner import default_embedder
        from memlib.io.store import StoreError
        from memlib.retrieve.base import RetrievalError
        from memlib.retrieve.kernels import run_search
        from memlib.retrieve.registry import get_strategy
        from memlib.retrieve.tenant_cache import TenantCache

        cfg = get_config(config, overrides)
        if k is not None and k < 1:
            fail(f"--k {k}: at least 1 node")
        name = cfg.retrieve.default_strategy if strategy is None else strategy
        try:
            strat = get_strategy(name, cfg)
            index = TenantCache(store, embedder=default_embedder(cfg, store), max_tenants=1).get(tenant)
            res = run_search(index, strat, question, k if k is not None else cfg.retrieve.k)
        except (StoreError, RetrievalError, KeyError, EmbedError) as exc:
            fail(one_line(exc))
        except (OSError, ValueError) as exc:  # a corrupt file of this tenant (pyarrow, graph-tool)
            fail(f"tenant {tenant!r} cannot be loaded: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
            return
        if as_json:
            typer.echo(json.dumps(res.to_dict(), indent=2, default=str))
            return
        typer.echo(f"# {name} on {tenant} (store {index.version}): {len(res.nodes)} nodes, "
                   f"{len(res.turns)} turns, {res.latency_ms:.1f} ms\n")
        typer.echo("## ranked turns")
        typer.echo("\n".join(ranked_turn_lines(res.turns)))
        typer.echo("\n## packed context")
        typer.echo(res.context)
