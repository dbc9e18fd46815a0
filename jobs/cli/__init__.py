"""The ``memlib`` command line. Each ``cmd_*.py`` module in this package registers its
commands with :func:`register`; this module only assembles them, and runs them in-process
(:func:`run`; ``python -m jobs.nightly`` is ``memlib build --incremental``)."""
from __future__ import annotations

import argparse
import gc
import importlib
import pkgutil
from typing import Annotated

import typer

app = typer.Typer(
    name="memlib",
    help="Build long-term memory for conversational agents in batch, and serve retrieval over it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from memlib import __version__

        typer.echo(f"memlib {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                                help="print memlib's version and exit")] = False) -> None:
    """memlib command line."""


def _load_commands() -> None:
    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("cmd_")):
        importlib.import_module(f"{__name__}.{mod}").register(app)


_load_commands()


def main() -> None:
    """The ``memlib`` process: its command, then an exit that does not collect what it loaded."""
    try:
        app()
    finally:
        # the interpreter's exit collects every object still alive (spaCy's vocabulary, the models,
        # pydantic's and lancedb's classes...): 0.6-0.7 s of an 8 s nightly run here. Frozen, they are
        # left to the process's end; nothing is lost (files are closed, Lance commits are done)
        gc.freeze()


def run(args: list[str], prog_name: str = "memlib") -> int:
    """Run ``memlib ARGS`` in this process; returns its exit code."""
    try:
        app(args=list(args), prog_name=prog_name)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return 0


class CommandParser:
    """A command's own options, read as the command reads them (no second parser to keep in step)."""

    def __init__(self, command: str, *fixed: str):
        self.command, self.fixed = command, fixed

    def parse_args(self, argv: list[str]) -> argparse.Namespace:
        """The options of ``memlib COMMAND FIXED... ARGV`` as written (the others: their defaults);
        a line the command would refuse raises click's usage error."""
        cmd = typer.main.get_command(app).commands[self.command]
        args = [*self.fixed, *argv]
        ctx = cmd.make_context(self.command, list(args))
        given, _, _ = cmd.make_parser(ctx).parse_args(list(args))
        return argparse.Namespace(**{**ctx.params, **given})


def command_parser(command: str, *fixed: str) -> CommandParser:
    return CommandParser(command, *fixed)
