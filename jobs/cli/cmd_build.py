"""``memlib build``: build (or rebuild) a memory store from an input file."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from jobs.cli.common import ConfigOpt, FormatOpt, SetOpt, fail, get_config
from memlib.config import Backend
from memlib.extract.base import Extraction

# the config sections --extractor sets (the LLM-capable extraction stages)
EXTRACTOR_SECTIONS = tuple(e.value for e in Extraction)


def extractor_overrides(extractor: Optional[Backend], set_: Optional[list[str]]) -> list[str]:
    """``--extractor X`` as ``<stage>.backend=X`` settings, placed before the user's ``--set``
    so a per-stage choice (``--set facts.backend=heuristic``) still wins."""
    pre = [f"{sec}.backend={extractor.value}" for sec in EXTRACTOR_SECTIONS] if extractor else []
    return pre + list(set_ or [])


def nightly_overrides(input_is_complete: bool, max_removed_share: Optional[float]) -> list[str]:
    """``--input-is-complete`` / ``--max-removed-share`` as settings (they win over --set)."""
    out = ["nightly.input_is_complete=true"] if input_is_complete else []
    return out + ([f"nightly.max_removed_share={max_removed_share}"] if max_removed_share is not None else [])


def format_dry_run(est: dict[str, Any]) -> str:
    lines = [f"dry run ({est['recipe']}, model {est['model']}): {est['tenants']} tenant(s), "
             f"{est['sessions']} sessions, {est['turns']} turns; LLM steps: {', '.join(est['llm_steps']) or 'none'}",
             f"  {'task':<12} {'calls':>7} {'input tok':>11} {'output tok':>11}"]
    for task, agg in sorted(est["by_task"].items()):
        lines.append(f"  {task:<12} {agg['calls']:>7} {agg['input_tokens']:>11} {agg['output_tokens']:>11}")
    lines.append(f"  {'total':<12} {est['calls']:>7} {est['input_tokens']:>11} {est['output_tokens']:>11}"
                 f"   est. cost ${est['cost_usd']:.4f}")
    if est["sessions"]:
        lines.append(f"  per session: {est['calls'] / est['sessions']:.1f} calls, "
                     f"{(est['input_tokens'] + est['output_tokens']) / est['sessions']:.0f} tokens")
    return "\n".join(lines)


def _progress(event: str, info: dict[str, Any]) -> None:
    if event == "read":
        typer.echo(f"read: {info['tenants']} tenant(s), {info['turns']} turns, {info['quarantined']} quarantined")
    elif event == "tenant":
        typer.echo(f"  tenant {info['tenant_id']}: {info['turns']} turns -> {info['nodes']} nodes, "
                   f"{info['edges']} edges in {info['seconds']:.1f}s")
        if info.get("llm"):
            typer.echo(f"    llm: {_kv(info['llm'])}")
    elif event == "tenant_failed":
        typer.echo(f"  tenant {info['tenant_id']} FAILED: {info['error']}")
    elif event == "graph":
        typer.echo(f"graph: {info.get('status')} {info.get('reason', '')}".rstrip())
    elif event == "embed":
        typer.echo(f"embed: {info['backend']}, the embedder {info['store']} was built with (name another with "
                   f"--set embed.backend=… to rebuild it in that one)")
    elif event == "plan":
        typer.echo("plan: " + ", ".join(f"{k} {len(v)}" for k, v in info.items()))
    elif event == "kept_damaged":
        typer.echo(f"kept session block {info['block']} is damaged ({info['reason']}): dropped, its sessions "
                   f"are computed again")
    elif event == "unchanged":
        typer.echo(f"unchanged: the input is what {info['version']} of {info['store']} was built from; "
                   f"no new version published")
    elif event == "published":
        typer.echo(f"published {info['version']} to {info['store']}")
        for tenant, reason in (info.get("failed") or {}).items():
            typer.echo(f"  FAILED tenant {tenant}: {reason}")
        removed = info.get("removed") or {}
        for tenant, reason in removed.items():
            typer.echo(f"  REMOVED tenant {tenant}: {reason}")
        deleted = [t for t in info.get("deleted") or [] if t not in removed]
        if deleted:
            more = ", …" if len(deleted) > 20 else ""
            typer.echo(f"  deleted {len(deleted)} tenant(s): {', '.join(deleted[:20])}{more}")
        kept = info.get("missing_kept") or []
        if kept:
            typer.echo(f"  kept {len(kept)} tenant(s) missing from the input as published ({', '.join(kept[:10])}"
                       f"{', …' if len(kept) > 10 else ''}): forget with --delete, or pass --input-is-complete")


def _kv(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"


def format_summary(m: dict[str, Any]) -> str:
    rc = m["row_counts"]
    lines = [
        f"store version {m['version']} (recipe {m['recipe']})",
        f"  tenants      {len(m['tenants'])}",
        f"  turns        {rc['turns']}",
        f"  questions    {rc['questions']}",
        f"  nodes        {rc['nodes']}: {_kv(m['nodes_by_kind'])}",
        f"  edges        {rc['edges']}: {_kv(m['edges_by_kind'])}",
        f"  quarantined  {rc['quarantine']}: {_kv(m['quarantine_by_reason'])}",
        f"  stage wall s {_kv(m['stage_timings_s'])}",
        f"  per-tenant s {_kv(m['tenant_stage_timings_s'])} (summed over workers)",
    ]
    if m.get("llm_calls"):
        lines.append(f"  llm calls    {_kv(m['llm_calls'])}")
    if m.get("dropped_edges_by_kind"):
        lines.append(f"  WARNING dropped dangling edges: {_kv(m['dropped_edges_by_kind'])}")
    return "\n".join(lines)


QUARANTINE_SHOWN = 10


class Interrupted(Exception):
    """SIGTERM during a build (a pod evicted, ``kill``, a scheduler's timeout), raised in the
    main thread like Ctrl-C's KeyboardInterrupt, so both end the same way: a message and
    128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum, frame) -> None:
    raise Interrupted(signum)


def interrupted_message(out: Path, signum: int) -> str:
    """What an interrupted build left: the published version (untouched) and what the next run resumes."""
    import signal

    from memlib.io.store import StoreError, read_manifest

    try:
        published = (read_manifest(out) or {}).get("version")
    except StoreError:
        published = None
    serves = f"it still serves {published}" if published else "it serves nothing yet"
    drop = f"`memlib build --out {out} --compact` drops them" if published else f"removing {out} drops them"
    return (f"interrupted ({signal.Signals(signum).name}): nothing was published to {out}; {serves}. The tenants "
            f"finished before the interruption are kept unpublished, and the next build of {out} resumes from "
            f"them ({drop})")


def quarantine_lines(store: Path, manifest: dict[str, Any], limit: int = QUARANTINE_SHOWN) -> list[str]:
    """The first ``limit`` quarantined records of this version, each named with its reason, and
    where the rest are (the quarantine table of the published version)."""
    from memlib.io.store import StoreReader

    reader = StoreReader(store, manifest)
    cols = ["tenant_id", "conversation_id", "record_id", "source", "location", "reason_code", "reason"]
    table = reader.table("quarantine", columns=cols)
    if not table.num_rows:
        return []
    out = ["quarantined records (the record, where it is, why):"]
    for r in table.slice(0, limit).to_pylist():
        where = ", ".join(x for x in (Path(r["source"]).name if r["source"] else None, r["location"]) if x)
        who = "/".join(x for x in (r["tenant_id"], r["conversation_id"], r["record_id"]) if x) or "?"
        out.append(f"  {who} ({where}): {r['reason_code']}: {r['reason']}")
    if table.num_rows > limit:
        out.append(f"  … and {table.num_rows - limit} more in {reader.version_dir / 'quarantine'}")
    return out


def register(app: typer.Typer) -> None:
    @app.command("build")
    def build(
        out: Annotated[Path, typer.Option("--out", "-o", help="store directory")],
        input: Annotated[Optional[str], typer.Option("--input", "-i", help="input file (or directory of "
                                                     "files with --incremental); local path or object "
                                                     "storage URI (s3://bucket/key, gs://…)")] = None,
        format: FormatOpt = None,
        config: ConfigOpt = None,
        set_: SetOpt = None,
        address: Annotated[Optional[str], typer.Option("--address", help="Ray cluster address (default: local; "
                                                       "or RAY_ADDRESS)")] = None,
        num_cpus: Annotated[Optional[int], typer.Option("--num-cpus", help="CPUs for local Ray")] = None,
        recipe: Annotated[str, typer.Option("--recipe", help="build recipe: full | episodes | turns")] = "full",
        extractor: Annotated[Optional[Backend], typer.Option("--extractor", help="backend of the LLM-capable "
                                                             "stages (facts, triplets, events, reflections); "
                                                             "--set <stage>.backend=... overrides one")] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="read + gate the input, print the planned LLM "
                                              "calls, tokens and cost; write nothing, call nothing")] = False,
        incremental: Annotated[bool, typer.Option("--incremental", help="rebuild only changed tenants, "
                                                  "carry the rest over (nightly)")] = False,
        delete: Annotated[Optional[Path], typer.Option("--delete", help="forget these tenants / tenant/conversation "
                                                       "ids (one per line); implies --incremental. They stay "
                                                       "forgotten: later input for them is ignored")] = None,
        rollback: Annotated[Optional[str], typer.Option("--rollback", help="publish an earlier VERSION again")] = None,
        compact: Annotated[bool, typer.Option("--compact", help="hard deletion: drop every unpublished and older "
                                              "version (Lance + Parquet); rollback is no longer possible")] = False,
        input_is_complete: Annotated[bool, typer.Option("--input-is-complete", help="the input holds every tenant: "
                                                        "published tenants missing from it are deleted, within "
                                                        "--max-removed-share (default with --incremental: kept; a "
                                                        "full build always treats its input as complete)")] = False,
        max_removed_share: Annotated[Optional[float], typer.Option("--max-removed-share", min=0.0, max=1.0,
                                                                   help="largest share of published tenants a build "
                                                                   "may delete for missing from the input "
                                                                   "(nightly.max_removed_share, default 0.1)")] = None,
    ) -> None:
        """Build memory tables (Lance/Parquet) and graphs from conversations, on Ray Data.

        Exit codes: 0 published; 2 nothing published (unusable input, refused deletion, usage error);
        3 published, but some tenants failed (each is named; a published one keeps its data);
        130 / 143 interrupted (Ctrl-C / SIGTERM): nothing published, the next build resumes."""
        from jobs.local_ray import export_local_ray_env

        if num_cpus is not None and num_cpus < 1:
            fail(f"--num-cpus {num_cpus}: at least 1 CPU")
        export_local_ray_env()
        if rollback or (compact and input is None):
            _maintain(out, rollback, compact)
            return
        if input is None or format is None:
            fail("--input and --format are required to build")
        cfg = get_config(config, extractor_overrides(extractor, set_) + nightly_overrides(input_is_complete,
                                                                                          max_removed_share))
        from memlib.compose.recipe import UnknownRecipeError
        from memlib.io.errors import InputError
        from memlib.io.remote import is_uri
        from memlib.io.store import StoreError
        if not is_uri(input) and not Path(input).exists():
            fail(f"input file not found: {input}")
        if dry_run:
            from pipelines.llm_actors import dry_run_input
            try:
                typer.echo(format_dry_run(dry_run_input(cfg, input, format, recipe)))
            except (InputError, UnknownRecipeError) as exc:
                fail(str(exc).strip("'\""))
            return
        import signal

        from jobs.builder import run_build
        try:
            previous = signal.signal(signal.SIGTERM, _raise_interrupted)
        except ValueError:  # not the main thread (memlib's CLI called from a program's thread): left as it is
            previous = None
        try:
            manifest = run_build(cfg, input, format, out, full=not (incremental or delete is not None),
                                 address=address or cfg.ray.address, num_cpus=num_cpus or cfg.ray.num_cpus,
                                 recipe=recipe, delete=delete, progress=_progress)
        except (InputError, UnknownRecipeError, StoreError) as exc:
            fail(str(exc).strip("'\""))
        except OSError as exc:  # the file system refused (read-only, full, permissions): one line, not a traceback
            if exc.errno is None:
                raise
            fail(f"{exc.filename or out}: {exc.strerror or exc}")
        except (KeyboardInterrupt, Interrupted, SystemExit) as exc:
            # once Ray is up, its driver handler turns SIGTERM into SystemExit(15) (ray.init)
            if isinstance(exc, SystemExit) and exc.code != signal.SIGTERM:
                raise
            signum = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else getattr(exc, "signum", signal.SIGTERM)
            typer.echo(interrupted_message(out, signum), err=True)
            raise typer.Exit(code=128 + int(signum)) from None
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            from jobs.local_ray import stop_local

            stop_local()  # the local Ray this build started, if any: stopped now, not by the exit handler
        typer.echo(format_summary(manifest))
        for line in quarantine_lines(out, manifest):
            typer.echo(line)
        if compact:
            _maintain(out, None, True)
        if manifest.get("incremental", {}).get("failed"):
            raise typer.Exit(code=3)


def _maintain(out: Path, version: Optional[str], compact: bool) -> None:
    """--rollback VERSION and --compact on an existing store."""
    from jobs.store_maintenance import compact as compact_store
    from jobs.store_maintenance import rollback_store
    from memlib.io.errors import InputError
    from memlib.io.store import StoreError

    if not (Path(out) / "manifest.json").is_file():  # before any lock file is made: a typo creates nothing
        fail(f"{out}: not a memlib store (no manifest.json)")
    try:
        if version:
            m = rollback_store(out, version)
            typer.echo(f"rolled back: {out} now serves {m['version']} (Lance version {m.get('lance_version')})")
        if compact:
            typer.echo(f"compacted: {compact_store(out)}")
    except (StoreError, InputError) as exc:
        fail(str(exc))
