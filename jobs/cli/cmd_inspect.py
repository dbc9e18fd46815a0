"""``memlib inspect``: what is in an input file (or, with ``--store``, a memory store)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from jobs.cli.common import ConfigOpt, SetOpt, fail, get_config, input_error, input_format, one_line

MAX_TENANT_ROWS = 25


def inspect_input(path: str | Path, fmt: str, cfg) -> dict[str, Any]:
    """Stream the input one tenant at a time and return totals plus per-tenant rows. Records whose
    tenant id cannot be read (they are quarantined) count in the totals under tenant ``None``."""
    from memlib.io.readers import iter_tenants
    from memlib.io.result import combine_summaries

    tenants = []
    for result in iter_tenants(path, fmt, cfg.io):
        row = result.summary()
        ids = result.tenant_ids
        row["tenant_id"] = ids[0] if ids else None
        tenants.append(row)
    return {"input": str(path), "format": fmt, "summary": combine_summaries(tenants), "tenants": tenants}


def inspect_directory(path: Path, fmt: Optional[str], cfg) -> dict[str, Any]:
    """Every input file of a directory, as a nightly build reads it (the format's suffix), each
    inspected on its own: a tenant with sessions in several files is counted in each."""
    from memlib.io.readers import SOURCE_SUFFIXES, input_sources

    fmt = input_format(str(path), fmt)
    files = input_sources(path, fmt)
    if not files:
        fail(f"{path}: no {fmt} input file in it (a nightly build reads the files named *"
             f"{' or *'.join(SOURCE_SUFFIXES.get(fmt, ('',)))})")
    from memlib.io.errors import InputError

    reports = []
    for f in files:
        try:
            reports.append(inspect_input(f, fmt, cfg))
        except InputError as exc:  # as a nightly run fails that file's tenants and reads the others
            reports.append({"input": str(f), "format": fmt, "error": exc.reason})
    return {"input": str(path), "format": fmt, "files": reports}


def _print_report(report: dict[str, Any]) -> None:
    s = report["summary"]
    typer.secho(f"{report['input']}  ({report['format']})", bold=True)
    for key in ("tenants", "conversations", "sessions", "turns", "questions"):
        typer.echo(f"  {key:<14}{s[key]:>10,}")
    typer.echo(f"  {'date range':<14}{s['first_session_time'] or '-'}  ..  {s['last_session_time'] or '-'}")
    color = typer.colors.YELLOW if s["quarantined"] else typer.colors.GREEN
    typer.secho(f"  {'quarantined':<14}{s['quarantined']:>10,}", fg=color)
    for code, n in s["quarantined_by_reason"].items():
        typer.echo(f"    {code:<20}{n:>6,}")
    rows = [t for t in report["tenants"] if t["tenant_id"] is not None]
    if not rows:
        return
    typer.echo("")
    typer.echo(f"  {'tenant':<24}{'conv':>6}{'sess':>6}{'turns':>8}{'quest':>7}{'quar':>6}  first .. last")
    for t in rows[:MAX_TENANT_ROWS]:
        first = (t["first_session_time"] or "-")[:10]
        last = (t["last_session_time"] or "-")[:10]
        typer.echo(f"  {t['tenant_id'][:24]:<24}{t['conversations']:>6}{t['sessions']:>6}{t['turns']:>8}"
                   f"{t['questions']:>7}{t['quarantined']:>6}  {first} .. {last}")
    if len(rows) > MAX_TENANT_ROWS:
        typer.echo(f"  ... {len(rows) - MAX_TENANT_ROWS} more tenants (use --json for all)")


def register(app: typer.Typer) -> None:
    @app.command("inspect")
    def inspect(
        input: Annotated[Optional[str], typer.Option("--input", "-i", help="input file to inspect (local path "
                                                     "or object storage URI), or a directory of them")] = None,
        fmt: Annotated[Optional[str], typer.Option("--format", "-f",
                                                   help="locomo | longmemeval | jsonl | parquet (default: "
                                                   "told from the file's content and name)")] = None,
        store: Annotated[Optional[Path], typer.Option("--store", help="a memory store directory")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
        config: ConfigOpt = None,
        overrides: SetOpt = None,
    ) -> None:
        """Count tenants, conversations, sessions, turns, questions, dates and quarantined records."""
        if (input is None) == (store is None):
            fail("pass exactly one of --input PATH or --store STORE")
        if store is not None:
            from jobs.cli import inspect_store
            from memlib.io.store import StoreError
            try:
                summaries = inspect_store.run(store, echo=not as_json) or []
                quarantine = inspect_store.quarantine_summary(store)
            except StoreError as exc:
                fail(one_line(exc))
            if as_json:
                from memlib.io.store import read_manifest

                manifest = read_manifest(store) or {}
                typer.echo(json.dumps({"store": str(store), "version": manifest.get("version"),
                                       "tenants": summaries, "quarantine": quarantine}, indent=2, default=str))
            elif quarantine["records"]:
                typer.echo(f"quarantined input records of this version: {quarantine['records']} ("
                           + ", ".join(f"{k} {v}" for k, v in quarantine["by_reason"].items())
                           + f"); the records and reasons: {quarantine['table']}")
            broken = [s["tenant"] for s in summaries if s.get("broken")]
            if broken:
                fail(f"{len(broken)} tenant(s) cannot be served: {', '.join(broken)}", code=1)
            return
        from memlib.io.errors import InputError

        cfg = get_config(config, overrides)
        try:
            if Path(input).is_dir():
                report = inspect_directory(Path(input), fmt, cfg)
            else:
                report = inspect_input(input, input_format(input, fmt), cfg)
        except InputError as exc:
            fail(input_error(exc, input, fmt))
        if as_json:
            typer.echo(json.dumps(report, indent=2))
        else:
            for one in report.get("files", [report]):
                if "error" in one:
                    typer.secho(f"{one['input']}: unreadable: {one['error']}", fg=typer.colors.RED)
                else:
                    _print_report(one)
        unreadable = [f["input"] for f in report.get("files", []) if "error" in f]
        if unreadable:
            fail(f"{len(unreadable)} file(s) of {input} cannot be read: {', '.join(Path(u).name for u in unreadable)}")
