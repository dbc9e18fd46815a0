"""``memlib check-env``: verify the runtime environment (graph-tool, numpy 1.x, pyarrow)."""
from __future__ import annotations

import importlib
import sys

import typer


def environment_problems() -> list[str]:
    problems: list[str] = []
    import numpy
    if int(numpy.__version__.split(".")[0]) >= 2:
        problems.append(f"numpy {numpy.__version__} is installed; graph-tool 2.45 from Debian needs numpy<2 "
                        "(it segfaults with numpy 2). Reinstall with: pip install 'numpy<2'")
    try:
        importlib.import_module("graph_tool")
    except Exception as exc:  # noqa: BLE001 - ImportError, or a binary incompatibility
        problems.append(f"graph-tool cannot be imported ({exc}). Install it from Debian "
                        "(apt-get install python3-graph-tool) and create the venv with "
                        "'/usr/bin/python3 -m venv --system-site-packages .venv'")
    import pyarrow
    if int(pyarrow.__version__.split(".")[0]) >= 26:
        problems.append(f"pyarrow {pyarrow.__version__} refuses numpy 1.x; install 'pyarrow<26'")
    return problems


def register(app: typer.Typer) -> None:
    @app.command("check-env")
    def check_env() -> None:
        """Check that graph-tool imports and numpy is 1.x; exit 1 with the fix if not."""
        problems = environment_problems()
        for p in problems:
            typer.secho(f"environment problem: {p}", fg=typer.colors.RED, err=True)
        if problems:
            raise typer.Exit(1)
        import numpy
        import pyarrow
        typer.echo(f"environment ok: python {sys.version.split()[0]}, numpy {numpy.__version__}, "
                   f"pyarrow {pyarrow.__version__}, graph-tool importable")
