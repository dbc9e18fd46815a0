"""The ``memlib`` command line. Each ``cmd_*.py`` module in this package registers its
commands with :func:`register`; this module only assembles them."""
from __future__ import annotations

import importlib
import pkgutil

import typer

app = typer.Typer(
    name="memlib",
    help="Build long-term memory for conversational agents in batch, and serve retrieval over it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """memlib command line."""


def _load_commands() -> None:
    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("cmd_")):
        importlib.import_module(f"{__name__}.{mod}").register(app)


_load_commands()


def main() -> None:
    app()
