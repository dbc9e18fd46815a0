"""Options and helpers shared by CLI commands."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer

from memlib.config import ConfigError, MemlibConfig, load_config

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="config file (TOML or YAML)")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="override: section.key=value (repeatable)")]
# the retrieval strategies, named in --help without importing them (a test checks the registry's list)
STRATEGY_NAMES = ("auto", "bm25", "dense", "hybrid", "gaama", "memorai", "assomem", "magma", "personalai")
DEFAULTS = MemlibConfig()  # defaults shown as values in --help


def default_note(key: str, value: object) -> str:
    """``default: VALUE (section.key)`` for --help: the value, and the setting that changes it."""
    return f"default: {value} ({key})"


FormatOpt = Annotated[Optional[str], typer.Option("--format", "-f", help="input format: locomo | longmemeval | "
                                                  "jsonl | parquet (default: told from the file's content and "
                                                  "name)")]


def fail(message: str, code: int = 2) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def one_line(exc: BaseException) -> str:
    """An exception's message on one line; a KeyError's quotes (its ``str`` is the repr of its
    argument) are taken off, and no other quote."""
    text = str(exc)
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        text = exc.args[0]
    return " ".join(text.split())


def input_format(path: str, fmt: Optional[str]) -> str:
    """``--format`` when given, else the format told from the file (memlib.io.detect): one rule
    for every command; a file of no known format is a one-line error naming those looked for."""
    from memlib.io.detect import detect_format
    from memlib.io.errors import InputError

    try:
        return detect_format(path, fmt)
    except InputError as exc:
        fail(one_line(exc))


def input_error(exc: BaseException, path: Optional[str], fmt: Optional[str]) -> str:
    """A reader's error as one line, saying which format the file looks like when the one named
    with --format is not it."""
    from memlib.io.detect import explain
    from memlib.io.errors import InputError

    if isinstance(exc, InputError) and path is not None:
        return one_line(Exception(explain(exc, path, fmt)))
    return one_line(exc)


def get_config(path: Optional[Path], overrides: Optional[list[str]]) -> MemlibConfig:
    try:
        return load_config(path, overrides or [], environ=os.environ)
    except ConfigError as exc:
        fail(str(exc))
