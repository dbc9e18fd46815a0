"""Options and helpers shared by CLI commands."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from memlib.config import ConfigError, MemlibConfig, load_config

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="config file (TOML or YAML)")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="override: section.key=value (repeatable)")]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help="input format: locomo | longmemeval | jsonl | parquet")]


def fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def get_config(path: Optional[Path], overrides: Optional[list[str]]) -> MemlibConfig:
    try:
        return load_config(path, overrides or [])
    except ConfigError as exc:
        fail(str(exc))
        raise  # unreachable
