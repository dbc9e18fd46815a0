"""``memlib demo-report``: what `make demo` prints after the build (which printed the store's
summary): one sample question's top turns by the default strategy (``retrieve.default_strategy``, ``auto``)
with provenance, and the recall table of the baselines next to that strategy."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from jobs.cli.common import ConfigOpt, FormatOpt, SetOpt, fail, get_config, input_format

if TYPE_CHECKING:  # polars is imported where it is used: not by every memlib process
    import polars as pl

BASELINES = ("bm25", "dense", "hybrid")


def top_turns(store: Path, cfg, embedder, tenant: str, question: str, evidence: list[str], k: int = 5) -> str:
    """The default strategy's top-k source turns for one question, evidence turns starred."""
    from jobs.cli.cmd_query import ranked_turn_lines
    from memlib.retrieve.kernels import run_search
    from memlib.retrieve.registry import get_strategy
    from memlib.retrieve.tenant_cache import TenantCache

    index = TenantCache(store, embedder=embedder, max_tenants=1).get(tenant)
    res = run_search(index, get_strategy(cfg.retrieve.default_strategy, cfg), question, cfg.retrieve.k)
    return "\n".join(ranked_turn_lines(res.turns, k, frozenset(evidence)))


def sample_question(questions: pl.DataFrame) -> dict | None:
    import polars as pl

    with_evidence = questions.filter(pl.col("evidence").list.len() > 0)
    return with_evidence.row(0, named=True) if with_evidence.height else None


def recall_table(store: Path, input_path: Path, fmt: str, cfg, embedder) -> str:
    from memlib.eval.questions import Dataset, read_questions
    from memlib.eval.report import format_table
    from memlib.eval.runner import evaluate

    dataset = Dataset(fmt)
    names = list(dict.fromkeys([*BASELINES, cfg.retrieve.default_strategy]))
    run = evaluate(store, read_questions(input_path, dataset, cfg), names, [5, 10], cfg,
                   dataset=dataset, embedder=embedder)
    return format_table(run.metrics)


def register(app: typer.Typer) -> None:
    @app.command("demo-report")
    def demo_report(
        store: Annotated[Path, typer.Option("--store", "-s", help="store directory")],
        input: Annotated[Path, typer.Option("--input", "-i", help="the input the store was built from")],
        format: FormatOpt = None,
        config: ConfigOpt = None,
        set_: SetOpt = None,
    ) -> None:
        """One sample query of a built store and the baseline recall table (`memlib build` has
        printed the store's summary)."""
        from memlib.eval.runner import default_embedder
        from memlib.io.store import StoreError, StoreReader

        cfg = get_config(config, set_)
        try:
            reader = StoreReader(store)
        except StoreError as exc:
            fail(str(exc))
        fmt = input_format(str(input), format)
        typer.echo(f"store {store}, version {reader.manifest.get('version')}: {len(reader.tenants())} tenant(s)")
        embedder = default_embedder(cfg, store)
        import polars as pl

        q = sample_question(pl.from_arrow(reader.table("questions")))
        if q is not None:
            typer.echo(f"\nsample question ({q['tenant_id']}): {q['question']}  [evidence {', '.join(q['evidence'])}]")
            typer.echo(f"top turns by {cfg.retrieve.default_strategy} (* = evidence):")
            typer.echo(top_turns(store, cfg, embedder, q["tenant_id"], q["question"], q["evidence"]))
            typer.echo(f"\nrecall, baselines and {cfg.retrieve.default_strategy} (protocol of memlib.eval):")
            typer.echo(recall_table(store, input, fmt, cfg, embedder))
        else:
            typer.echo("\nthe input has no questions with evidence: no sample query or recall table")
