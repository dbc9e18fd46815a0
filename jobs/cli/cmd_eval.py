"""``memlib eval``: score retrieval strategies over a store's questions."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.common import (
    DEFAULTS,
    ConfigOpt,
    SetOpt,
    default_note,
    fail,
    get_config,
    input_error,
    input_format,
    one_line,
)


def _parse_ks(spec: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        fail(f"--k must be comma-separated integers, got {spec!r}")
        raise
    if not ks or ks[0] < 1:
        fail(f"--k values must be >= 1, got {spec!r}")
    return ks


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_cmd(
        store: Annotated[Path, typer.Option("--store", "-s", help="memory store directory")],
        input_path: Annotated[Optional[str], typer.Option(
            "--input", "-i", help="input file the store was built from (questions + evidence; local path "
                                  "or object storage URI); default: the store's questions table")] = None,
        fmt: Annotated[Optional[str], typer.Option(
            "--format", "-f", help="locomo | longmemeval | jsonl | parquet (default: with --input, told from "
                                   "the file's content and name; without it, the format the store was built "
                                   "from)")] = None,
        strategies: Annotated[str, typer.Option("--strategies", help="comma-separated strategy names (an "
                                                "unknown name lists the known ones)")] = "auto,bm25,dense,hybrid",
        k: Annotated[Optional[str], typer.Option("--k", help="cut-offs, e.g. 1,3,5,10,20; "
                                       f"{default_note('eval.ks', ','.join(map(str, DEFAULTS.eval.ks)))}")] = None,
        out: Annotated[Optional[Path], typer.Option("--out", "-o", help="output directory (default: eval_out)")]
        = None,
        answer_model: Annotated[Optional[str], typer.Option("--answer-model", help="QA: model answering from "
                                                            "the packed context (needs llm.base_url)")] = None,
        judge_model: Annotated[Optional[str], typer.Option("--judge-model", help="QA: judge model")] = None,
        config: ConfigOpt = None,
        overrides: SetOpt = None,
    ) -> None:
        """Run strategies in-process over the questions; write metrics.json, per_question.parquet,
        report.md and plots; print the overall table."""
        from memlib.embed.base import EmbedError
        from memlib.eval.questions import Dataset, read_questions
        from memlib.eval.report import format_table, lme_table
        from memlib.eval.runner import evaluate
        from memlib.io.errors import InputError
        from memlib.io.store import StoreError, StoreReader
        from memlib.retrieve.base import RetrievalError

        cfg = get_config(config, overrides)
        fmt_given = fmt
        try:
            reader = StoreReader(store)
        except StoreError as exc:
            fail(one_line(exc))
        if fmt is None:  # the store's own questions are scored by the rules of the format it was built from
            built = str((reader.manifest.get("input") or {}).get("format") or "")
            if input_path is not None:
                fmt = input_format(input_path, None)
            elif built in (Dataset.LOCOMO.value, Dataset.LONGMEMEVAL.value):
                fmt = built
            else:
                fmt = Dataset.STORE.value  # generic rules
        try:
            dataset = Dataset(fmt)
        except ValueError:
            fail(f"unknown --format {fmt!r}; expected locomo, longmemeval, jsonl or parquet")
        ks = _parse_ks(k) if k else list(cfg.eval.ks)
        try:
            questions = read_questions(input_path, dataset, cfg) if input_path else reader.table("questions")
            run = evaluate(store, questions, strategies, ks, cfg, dataset=dataset,
                           progress=_progress() if out is not None else None, keep_going=True)
        except (StoreError, RetrievalError, InputError, FileNotFoundError, EmbedError) as exc:
            fail(input_error(exc, input_path, fmt_given))
            return
        out_dir = out or Path("eval_out")
        from memlib.eval.qa import maybe_score_qa
        qa_note = maybe_score_qa(run, cfg, answer_model or cfg.eval.answer_model, judge_model or cfg.eval.judge_model)
        from memlib.eval.report import write_report

        paths = write_report(run, out_dir)
        typer.echo(format_table(run.metrics))
        lme = lme_table(run.metrics)
        if lme:
            typer.echo("\n" + lme)
        if qa_note:
            typer.echo(qa_note)
        typer.echo(f"\nwrote {paths['metrics']} and {len(paths) - 1} more files to {out_dir}")
        from memlib.eval.report import failed_lines

        for line in failed_lines(run.metrics)[:-1]:  # the strategies that raised: scored without them, exit 1
            typer.secho(line.removeprefix("- "), fg=typer.colors.RED, err=True)
        if run.metrics.get("failed"):
            raise typer.Exit(1)


def _progress():
    """Questions per strategy on stderr (stdout is the table): N/M, rate and ETA on a terminal,
    one line per strategy otherwise (jobs/progress.py)."""
    import sys

    from jobs.progress import CountProgress

    return CountProgress(stream=sys.stderr)
