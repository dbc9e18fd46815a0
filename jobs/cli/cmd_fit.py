"""``memlib fit-assomem``: fit AssoMem's CMI fusion weights on a labelled dev split."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.common import ConfigOpt, SetOpt, fail, get_config


def register(app: typer.Typer) -> None:
    @app.command("fit-assomem")
    def fit_assomem(
        store: Annotated[Path, typer.Option("--store", "-s", help="memory store directory")],
        input_path: Annotated[Path, typer.Option("--input", "-i", help="input file with questions + evidence")],
        fmt: Annotated[str, typer.Option("--format", "-f", help="locomo | longmemeval | jsonl | parquet")] = "locomo",
        tenants: Annotated[str, typer.Option("--tenants", help="comma-separated tenants to fit on (default: every "
                                             "tenant with questions in the input)")] = "",
        temperature: Annotated[float, typer.Option("--temperature", help="softmax temperature T")] = 0.01,
        out: Annotated[Optional[Path], typer.Option("--out", "-o", help="weights file "
                                                    "(default memlib/retrieve/fitted/assomem.json)")] = None,
        config: ConfigOpt = None,
        overrides: SetOpt = None,
    ) -> None:
        """Fit softmax(CMI/T) weights per question type and write them as JSON."""
        import polars as pl

        from memlib.embed.base import EmbedError
        from memlib.eval.questions import Dataset, read_questions
        from memlib.eval.runner import default_embedder
        from memlib.retrieve import cmi
        from memlib.retrieve.assomem_fit import fit_store, write_fitted
        from memlib.retrieve.tenant_cache import TenantCache

        cfg = get_config(config, overrides)
        names = [t.strip() for t in tenants.split(",") if t.strip()]
        try:
            questions = pl.from_arrow(read_questions(input_path, Dataset(fmt), cfg))
            names = names or sorted(questions["tenant_id"].unique().to_list())
            cache = TenantCache(store, embedder=default_embedder(cfg, store))
            data = fit_store(cache, questions, names, temperature)
        except (ValueError, KeyError, FileNotFoundError, EmbedError) as exc:
            fail(str(exc))
            return
        path = write_fitted(data, out or cmi.FITTED_PATH)
        for qtype, v in data["types"].items():
            w = ", ".join(f"{s} {x:.2f}" for s, x in v["weights"].items())
            typer.echo(f"{qtype:7s} n={v['n']:6d}  {w}")
        typer.echo(f"wrote {path}")
