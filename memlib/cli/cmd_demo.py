"""``memlib demo-report``: what `make demo` prints after the build: the store summary, one
sample question's top nodes by a plain dense lookup, and the baseline retrieval table."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import polars as pl
import typer

from memlib.cli.common import ConfigOpt, FormatOpt, SetOpt, fail, get_config

BASELINES = ("bm25", "dense", "hybrid")


def _vectors(table) -> np.ndarray:
    emb = table.column("embedding").combine_chunks()
    return emb.values.to_numpy(zero_copy_only=False).reshape(-1, emb.type.list_size)


def dense_top(reader, embedder, tenant: str, question: str, k: int = 5) -> pl.DataFrame:
    """Exact cosine top-k over one tenant's nodes (every kind)."""
    nodes = reader.nodes(tenant=tenant, columns=["node_id", "kind", "text", "embedding"])
    q = embedder.embed_queries([question])[0]
    scores = _vectors(nodes) @ q
    top = np.argsort(-scores)[:k]
    return pl.DataFrame({"score": scores[top].round(3), "kind": nodes.column("kind").take(top).to_pylist(),
                         "text": [t[:110] for t in nodes.column("text").take(top).to_pylist()]})


def sample_question(questions: pl.DataFrame) -> dict | None:
    with_evidence = questions.filter(pl.col("evidence").list.len() > 0)
    return with_evidence.row(0, named=True) if with_evidence.height else None


def baseline_table(store: Path, input_path: Path, fmt: str, cfg, embedder) -> str:
    from memlib.eval.questions import Dataset, read_questions
    from memlib.eval.report import format_table
    from memlib.eval.runner import evaluate

    dataset = Dataset(fmt)
    run = evaluate(store, read_questions(input_path, dataset, cfg), list(BASELINES), [5, 10], cfg,
                   dataset=dataset, embedder=embedder)
    return format_table(run.metrics)


def register(app: typer.Typer) -> None:
    @app.command("demo-report")
    def demo_report(
        store: Annotated[Path, typer.Option("--store", "-s", help="store directory")],
        input: Annotated[Path, typer.Option("--input", "-i", help="the input the store was built from")],
        format: FormatOpt,
        config: ConfigOpt = None,
        set_: SetOpt = None,
    ) -> None:
        """Summary of a built store, one sample query, and the baseline recall table."""
        from memlib.cli.cmd_build import format_summary
        from memlib.embed import get_embedder
        from memlib.io.store import StoreError, StoreReader

        cfg = get_config(config, set_)
        try:
            reader = StoreReader(store)
        except StoreError as exc:
            fail(str(exc))
        typer.echo(format_summary(reader.manifest))
        embedder = get_embedder(cfg.embed)
        q = sample_question(pl.from_arrow(reader.table("questions")))
        if q is not None:
            typer.echo(f"\nsample question ({q['tenant_id']}): {q['question']}  [evidence {', '.join(q['evidence'])}]")
            with pl.Config(fmt_str_lengths=110, tbl_width_chars=160, tbl_hide_dataframe_shape=True):
                typer.echo(dense_top(reader, embedder, q["tenant_id"], q["question"]))
            typer.echo("\nbaselines (turn/session recall, protocol of memlib.eval):")
            typer.echo(baseline_table(store, input, format, cfg, embedder))
        else:
            typer.echo("\nthe input has no questions with evidence: no sample query or recall table")
