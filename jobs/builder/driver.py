"""The memory build's one driver: ``memlib build`` (``full``) and ``memlib build --incremental``.

read -> plan (:mod:`jobs.builder.plan`) -> shard by tenant -> one Ray Data dataset of session
blocks and tenants (:mod:`jobs.builder.tenants`, pipelines/staged_build.py) -> Lance/Parquet ->
indexes -> manifest -> publish. Local Ray by default; ``address`` or the RAY_ADDRESS environment
variable (read in jobs/local_ray.py, never in memlib/) targets a cluster.

Incremental: only tenants whose input hash or build key changed are rebuilt; unchanged tenants
are carried over (hard links, Lance rows untouched); forgotten tenants and conversations
(``--delete FILE``, persisted in the manifest) disappear from every table of the next version.
A tenant missing from the input is kept, unless ``nightly.input_is_complete`` (then within
``nightly.max_removed_share``); an unusable input publishes nothing. A tenant whose build fails,
or whose input file cannot be read, keeps its previous published data and is listed as failed.
Every finished tenant leaves a completion marker in the unpublished version directory, so a
rerun after a driver crash resumes from the finished tenants (:mod:`jobs.builder.resume`).
"""
from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl

from jobs.builder.guards import discard_if_refused, rebuild_damaged
from jobs.builder.lock import locked
from jobs.builder.plan import ForgetList, TenantStatus, check_readable, fingerprint_sources, make_plan, settle_missing
from jobs.builder.publish import publish
from jobs.builder.resume import ResumableWriter
from jobs.builder.run import BuildOptions, Built, PhaseTimer, Progress, Run, Sharded
from jobs.builder.tenants import build_tenants, shard_and_prepare
from jobs.local_ray import init_ray, ray_up
from memlib.compose.keys import build_key, session_build_key
from memlib.compose.recipe import Phase, get_recipe
from memlib.config import MemlibConfig
from memlib.embed.space import kept_space, space_change
from memlib.io.readers import input_sources
from memlib.io.remote import is_uri, staged_input
from memlib.io.store import StoreError, read_manifest
from pipelines.context import BuildContext
from pipelines.inline import inline_fits, prewarm, tenant_workers
from pipelines.prefetch import PublishedPrefetch, prefetch_order, quick_handoff
from pipelines.staged_build import kept_reads


def run_config(cfg: MemlibConfig, base: dict[str, Any] | None, out: str, progress: Progress) -> MemlibConfig:
    """The config a run builds with: ``cfg``, with the store's embedder when ``cfg`` names none (a
    store's embedder is never switched by omission)."""
    kept = kept_space(cfg.embed, base)
    if kept is None:
        return cfg
    progress("embed", {"backend": kept.backend, "store": out})
    return cfg.model_copy(update={"embed": kept})


def start_run(cfg: MemlibConfig, source: tuple[Any, str], out: str | Path, full: bool,
              options: BuildOptions) -> Run:
    """The run's context, made once: its config, keys, store layout and reuse rule."""
    started = time.perf_counter()
    base = read_manifest(out)
    run_cfg = run_config(cfg, base, str(out), options.progress)
    new_space = space_change(base, run_cfg.embed, str(out))
    forget = ForgetList.load(options.delete, (base or {}).get("forgotten"))
    writer = ResumableWriter(out, dim=run_cfg.embed.dim)
    key = build_key(run_cfg, options.recipe)
    ctx = BuildContext(run_cfg, options.recipe, str(writer.path), session_build_key(run_cfg, key), key,
                       reuse=not full, version_dir=str(writer.version_dir))
    return Run(ctx, writer, base, forget, source, str(out), full, new_space, options.progress,
               timer=PhaseTimer(options.progress), started=started)


def plan_and_shard(run: Run, options: BuildOptions) -> Sharded:
    """Read and plan (an unusable input, or a deletion above the allowed share, publishes nothing),
    then shard the input while Ray starts (a run with nothing to build never starts it)."""
    cfg, writer, full, (input_path, fmt) = run.ctx.cfg, run.writer, run.full, run.source
    with (discard_if_refused(writer), run.timer.span(Phase.READ),
          staged_input(input_path, cfg.io.staging_dir) as local_input):
        sources = input_sources(local_input, fmt)
        read = fingerprint_sources(sources, fmt, cfg, run.forget)
        check_readable(input_path, sources, read, full=full)  # an unusable input publishes nothing
        run.plan = plan = make_plan(None if full else run.base, read.hashes, read.sources, run.ctx.build_key,
                                    {} if full else writer.done_markers(), read.failed)
        settle_missing(plan, run.base, run.forget.tenants, complete=full or cfg.nightly.input_is_complete,
                       max_share=cfg.nightly.max_removed_share)
        rebuild_damaged(plan, writer.base)
        inline = _may_inline(run, options)
        run.progress("planned", {**plan.to_json(), "tenants": len(read.hashes), "ray": not inline,
                                 "seconds": time.perf_counter() - run.started})
        if run.new_space and plan.carry:  # every tenant of the input is rebuilt (new build key); these would not be
            raise StoreError(f"{run.new_space}; {len(plan.carry)} published tenant(s) missing from the input "
                             f"({', '.join(plan.carry[:5])}) would keep the old model's vectors, and a store cannot "
                             f"mix the vectors of two models. To switch, rebuild the store whole (`memlib build` "
                             f"without --incremental)")
        if inline:  # sharded first: its pending turns decide (what the operators load, meanwhile)
            warm = ThreadPoolExecutor(1, thread_name_prefix="memlib-warm")
            loading = warm.submit(prewarm, run.ctx)
            warm.shutdown(wait=False)  # its thread ends with its work; a run in the driver does not wait for it
            run.prefetch = _prefetch(run)  # the published builds its rows start from, read meanwhile
            with quick_handoff():
                sharded = shard_and_prepare(run, sources, read.failed)
            work = sharded.sessions.pending_turns if sharded.sessions else 0
            if inline_fits(run.ctx, len(sharded.to_build), work):
                _read_kept_ahead(run, sharded)
                run.inline = True
                run.progress("inline", {"tenants": len(sharded.to_build), "turns": work})
                return sharded
            run.close_prefetch()  # Ray's tenant actors read their own
            loading.result()  # before Ray's processes are started (lancedb warns about forks)
            target = _start_ray(run, options) if sharded.to_build else None
        else:
            # Ray starts (seconds of its processes coming up) while the input is sharded and the
            # pending sessions are packed into blocks; a run with nothing to build never starts it
            with ThreadPoolExecutor(1, thread_name_prefix="memlib-shard") as reader:
                pending = reader.submit(shard_and_prepare, run, sources, read.failed)
                target = _start_ray(run, options) if plan.build else None
                sharded = pending.result()
    if target is not None:
        run.ctx = run.ctx.on_ray(target.cpus, target.worker_env_inherited)
    return sharded


def _start_ray(run: Run, options: BuildOptions) -> Any:
    with run.timer.span(Phase.RAY_START):
        return init_ray(options.address, options.num_cpus, token_auth=run.ctx.cfg.ray.local_token_auth,
                        quiet=options.quiet_ray)


def _prefetch(run: Run) -> PublishedPrefetch | None:
    """Start reading the published builds of the tenants to rebuild (pipelines/prefetch.py): as many
    at a time as the run in the driver builds rows at once."""
    tenants = prefetch_order(run.plan.build, run.published, run.ctx.cfg.ray.tenant_batch_turns)
    if not run.ctx.reuses_tenants or not tenants:
        return None
    ahead = tenant_workers(os.cpu_count() or 1, len(tenants))
    return PublishedPrefetch(run.ctx.store, run.ctx.session_key, tenants, ahead).start()


def _read_kept_ahead(run: Run, sharded: Sharded) -> None:
    """The rows' sessions kept by earlier runs, read by the prefetch too, once they are planned."""
    if run.prefetch is not None and sharded.sessions is not None:
        building = {s.tenant_id for s in sharded.to_build}
        tenants = [t for t in run.prefetch.order if t in building]
        run.prefetch.read_kept(kept_reads(sharded.sessions, tenants), run.ctx.cfg.embed.dim)


def _may_inline(run: Run, options: BuildOptions) -> bool:
    """Whether the run could build in this process (:mod:`pipelines.inline`): it would start a
    local Ray of its own (no cluster named, none connected) and the plan is small enough."""
    if options.address or os.environ.get("RAY_ADDRESS") or ray_up():
        return False
    return inline_fits(run.ctx, len(run.plan.build), None)


def tenants_phase(run: Run, sharded: Sharded) -> Built:
    """Build the tenants on Ray while Lance is restored for the write (once the first tenant is done)."""
    writer, plan = run.writer, run.plan
    session_stats: dict[str, Any] = {}
    # Lance is first needed when the tenants are written: its restore (and lancedb's import, 1.3-2.4
    # CPU-s) runs while the tenant stages do, once the first tenant is done: not while the actors
    # start and load their models, nor before Ray's processes are started (lancedb warns about forks)
    with ThreadPoolExecutor(1, thread_name_prefix="memlib-lance") as background:
        lance_restored: list[Future] = []

        def restore_once() -> None:
            if not lance_restored:
                lance_restored.append(background.submit(writer.start_new_space) if run.new_space else
                                      background.submit(writer.restore_published, run.base))

        with run.timer.span(Phase.TENANTS):
            summaries = build_tenants(run, sharded, session_stats, tenant_done=restore_once)
        run.close_prefetch()  # what no row took (a tenant that failed first)
        lance_restored[0].result()
    summaries += [{**m["summary"], "status": TenantStatus.RESUMED.value} for m in plan.resume.values()]
    done = {s["tenant_id"] for s in summaries}
    ok_shards = [s for s in sharded.shards if s.tenant_id in done]
    graph = {"status": "built", "tenants": len(ok_shards), "where": "tenant stage"}
    return Built(summaries, sharded.quarantine, session_stats, graph)


@locked("out")
def run_build(cfg: MemlibConfig, input_path: str | Path, fmt: str, out: str | Path, *, full: bool = True,
              **options: Any) -> dict[str, Any]:
    """Build the next store version and publish it; returns the manifest. ``options``: those of
    :class:`~jobs.builder.run.BuildOptions` (address, num_cpus, recipe, delete, progress).

    ``full`` (default, ``memlib build``): every tenant of the input is rebuilt from scratch (no
    carry-over, no kept session outputs reused); the published version holds exactly the input's
    tenants (removing published ones only within ``nightly.max_removed_share``). A full build is
    this run against an empty store. Incremental (``full=False``, ``memlib build --incremental``):
    unchanged tenants are carried over, and a changed tenant recomputes only its new or changed
    sessions before its tenant-level stages."""
    opts = BuildOptions(**options)
    get_recipe(opts.recipe)
    # workers of a Ray started earlier in this process keep the directory it started in: a
    # relative path means the driver's directory now, so it is made absolute here
    input_path, out = _absolute(input_path), _absolute(out)
    pl.thread_pool_size()  # polars sizes its pool now: Ray's start sets POLARS_MAX_THREADS=1 for a moment
    run = start_run(cfg, (input_path, str(fmt)), out, full, opts)
    try:
        sharded = plan_and_shard(run, opts)
        opts.progress("plan", run.plan.to_json())
        if not full and run.plan.changes_nothing(run.base, run.forget):
            # the input is the published one: no new version (a replica has nothing to reload)
            shutil.rmtree(run.writer.version_dir, ignore_errors=True)
            opts.progress("unchanged", {"version": run.base["version"], "store": run.out})
            return run.base
        return publish(run, tenants_phase(run, sharded))
    finally:
        run.close_prefetch()


def _absolute(path: str | Path) -> str | Path:
    """``path`` made absolute against the current directory (a URI is left as it is)."""
    if is_uri(path):
        return path
    return Path(path).absolute() if isinstance(path, Path) else str(Path(path).absolute())


def run_incremental(cfg: MemlibConfig, input_path: str | Path, fmt: str, out: str | Path,
                    **options: Any) -> dict[str, Any]:
    """:func:`run_build` with ``full=False``: ``memlib build --incremental``."""
    return run_build(cfg, input_path, fmt, out, full=False, **options)
