"""``memlib verify``: check a store the way fsck checks a file system (jobs/cli/verify_store.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from jobs.cli.common import fail

NOT_WHOLE = 3  # problems found (2: no store to check)


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify_cmd(
        store: Annotated[Path, typer.Option("--store", "-s", help="the store directory")],
        drop_damaged: Annotated[bool, typer.Option(
            "--drop-damaged", help="remove the kept files found damaged (kept session blocks, token matrices, "
                                   "LLM responses): builds and queries compute them again")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="one JSON document: problems, what was checked")] = False,
    ) -> None:
        """Read every file the published manifest names, check each tenant's rows, edges and graph,
        its Lance rows (against their content checksum), the Lance tables' index and manifest files and
        every kept file against the checksum written with it. One line per problem, with the command
        that repairs it; exit 0 only when the store is whole (3: problems; 2: no store)."""
        from jobs.cli import verify_store
        from memlib.io.files import StoreError

        if not (store / "manifest.json").is_file():
            fail(f"{store}: not a memlib store (no manifest.json)")
        try:
            report = verify_store.verify(store)
        except StoreError as exc:
            fail(str(exc), NOT_WHOLE)
        if as_json:
            typer.echo(verify_store.as_json(report))
        else:
            for line in report.problems:
                typer.echo(line)
            checked = ", ".join(f"{n} {what}" for what, n in report.checked.items())
            typer.echo(f"{store}: {'whole' if not report.problems else f'{len(report.problems)} problem(s)'} "
                       f"({checked or 'nothing'} checked)")
        if drop_damaged and report.damaged:
            for path in verify_store.drop(report):
                typer.echo(f"dropped {path}")
        if report.problems:
            raise typer.Exit(NOT_WHOLE)
