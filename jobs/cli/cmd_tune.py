"""``memlib tune``: cross-validated parameter choice for one strategy over several datasets."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.common import ConfigOpt, SetOpt, fail, get_config

OutOpt = Annotated[Path, typer.Option("--out", "-o", help="output directory (tune.json, tune.md)")]


def register(app: typer.Typer) -> None:
    @app.command("tune")
    def tune_cmd(
        data: Annotated[list[str], typer.Option(
            "--data", help="FORMAT:STORE[:INPUT] (no INPUT: the store's questions table), e.g. "
                           "locomo:/stores/l3:../shared/data/locomo_dev3.json (repeatable; tuned together)")],
        grid: Annotated[list[str], typer.Option(
            "--grid", help="param=v1,v2,... (repeatable; the grid is the cartesian product; on ties the "
                           "earlier configuration wins, so list the simpler value first)")],
        strategy: Annotated[str, typer.Option("--strategy", help="strategy to tune")] = "auto",
        folds: Annotated[int, typer.Option("--folds", help="folds (whole tenants per fold)")] = 3,
        objective: Annotated[Optional[list[str]], typer.Option(
            "--objective", help="FORMAT=metric+metric (repeatable; default: memlib/eval/tune.py "
                                "DEFAULT_OBJECTIVE)")] = None,
        out: OutOpt = Path("tune_out"),
        cache: Annotated[Optional[Path], typer.Option(
            "--cache", help="per-question results per configuration (default: OUT/cache)")] = None,
        config: ConfigOpt = None,
        overrides: SetOpt = None,
    ) -> None:
        """Choose the strategy's parameters by cross-validation (a tenant is never scored by a
        configuration chosen on its own questions); print the per-fold choices and the
        cross-validated figures; write tune.json and tune.md."""
        from memlib.embed.base import EmbedError
        from memlib.eval import crossval, tune, tune_report
        from memlib.eval.questions import Dataset
        from memlib.io.errors import InputError
        from memlib.io.store import StoreError
        from memlib.retrieve.base import RetrievalError
        from memlib.retrieve.registry import parse_strategies

        cfg = get_config(config, overrides)
        if folds < 2:
            fail(f"--folds must be at least 2, got {folds}")
        try:
            parse_strategies([strategy])
            configs = tune.parse_grid(grid)
            goals = _objectives(objective, Dataset)
            sets = [tune.load_data(*_split(spec), cfg, folds) for spec in data]
            scored = []
            for d in sets:
                frames = tune.per_question(d, strategy, configs, cfg, cache or out / "cache", _progress)
                scored.append(crossval.Scored(d.name, goals.get(d.dataset, tune.DEFAULT_OBJECTIVE.get(
                    d.dataset, ("turn_recall@10",))), frames))
        except (ValueError, StoreError, RetrievalError, InputError, FileNotFoundError, EmbedError) as exc:
            fail(str(exc))
            return
        fold_results, pooled = crossval.cross_validate(scored, folds)
        res = tune_report.summary(strategy, configs, scored, fold_results, pooled, folds)
        js, md = tune_report.write(res, out)
        typer.echo(tune_report.markdown(res).split("## In-sample")[0])
        typer.echo(f"wrote {js} and {md}")


def _split(spec: str) -> tuple[str, str, str | None]:
    """FORMAT:STORE[:INPUT]; without INPUT the store's own questions table is used."""
    parts = spec.split(":", 2)
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"--data {spec!r} is not FORMAT:STORE[:INPUT]")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


def _objectives(specs, dataset_enum) -> dict:
    out = {}
    for spec in specs or []:
        fmt, sep, metrics = spec.partition("=")
        if not sep or not metrics:
            raise ValueError(f"--objective {spec!r} is not FORMAT=metric+metric")
        out[dataset_enum(fmt)] = tuple(m.strip() for m in metrics.split("+") if m.strip())
    return out


def _progress(name: str, tenant: str) -> None:
    typer.echo(f"  {name}: {tenant} done", err=True)
