"""``memlib bench …``: benchmarks that print JSON figures. Each ``bench_*.py`` module in
this package registers one subcommand on the ``bench`` group."""
from __future__ import annotations

import importlib
import pkgutil

import typer

import jobs.cli as _cli_pkg

bench_app = typer.Typer(help="Benchmarks: each prints one JSON document of measured figures.",
                        no_args_is_help=True)


def register(app: typer.Typer) -> None:
    for mod in sorted(m.name for m in pkgutil.iter_modules(_cli_pkg.__path__) if m.name.startswith("bench_")):
        importlib.import_module(f"jobs.cli.{mod}").register(bench_app)
    app.add_typer(bench_app, name="bench")
