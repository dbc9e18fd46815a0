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

import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.builder.counts import store_counts
from jobs.builder.guards import discard_if_refused, drop_partitions, rebuild_damaged, remove_unkeepable
from jobs.builder.lock import locked
from jobs.builder.plan import (
    ForgetList,
    Plan,
    TenantStatus,
    build_key,
    check_readable,
    fingerprint_sources,
    make_plan,
    settle_missing,
)
from jobs.builder.resume import DONE_DIR, ResumableWriter
from jobs.builder.tenants import build_tenants, shard_and_prepare
from jobs.local_ray import init_ray
from memlib.compose.manifest import TENANT_COUNTS, build_manifest
from memlib.compose.recipe import DEFAULT_RECIPE, Phase, get_recipe
from memlib.compose.timer import WallTimer
from memlib.config import MemlibConfig
from memlib.embed.space import kept_space, space_change
from memlib.io.readers import input_sources
from memlib.io.remote import staged_input
from memlib.io.store import PART_KEY, PART_TENANTS_KEY, Carried, StoreError, StoreReader, StoreWriter, read_manifest
from pipelines.staged_build import session_build_key
from pipelines.store_sink import drop_staging

log = logging.getLogger("memlib.nightly")
Progress = Callable[[str, dict[str, Any]], None]


def _quiet(event: str, info: dict[str, Any]) -> None:
    log.info("%s %s", event, info)


def _write_lance(writer: StoreWriter, summaries: list[dict[str, Any]], parts: dict[str, str], remove: list[str],
                 rows_per_commit: int) -> None:
    """Replace rebuilt tenants' nodes and delete removed tenants' in commits that follow rows (one
    delete, then batches of ``rows_per_commit`` rows); carried tenants stay untouched. Each staged
    file holds one row's tenants (a part) and is read when its batch is written; only the tenants
    the version keeps in that part are taken (an interrupted run's part may hold a tenant rebuilt
    since)."""
    staged: dict[str, list[str]] = {}
    for s in summaries:
        if parts.get(s["tenant_id"]) == s["part"]:
            staged.setdefault(s["nodes_path"], []).append(s["tenant_id"])

    def tables():
        for path, tenants in sorted(staged.items()):
            t = pq.read_table(path)
            yield t.filter(pc.is_in(t.column("tenant_id"), value_set=pa.array(tenants, pa.string())))

    writer.write_tenants([s["tenant_id"] for s in summaries] + list(remove), tables(), rows_per_commit=rows_per_commit)


def _carried_summary(tenant: str, old: dict[str, Any], counts: dict[str, Any] | None) -> dict[str, Any]:
    """A carried tenant's summary: its published totals, and its counts by kind when its version
    kept them (``counts``)."""
    return {"tenant_id": tenant, **{k: old.get(k, 0) for k in ("turns", "nodes", "edges", "segments")},
            **(counts or {})}


def _finish_manifest(manifest, plan: Plan, base, key, forget, node_kinds, edge_kinds, summaries) -> dict:
    prev = (base or {}).get("tenants", {})
    built = {s["tenant_id"] for s in summaries if s.get("status") != TenantStatus.RESUMED.value}
    for tenant, entry in manifest["tenants"].items():
        status = (TenantStatus.BUILT if tenant in built else TenantStatus.RESUMED if tenant in plan.resume
                  else TenantStatus.CARRIED)
        entry.update(status=status.value, source=plan.sources.get(tenant), input_hash=plan.hashes.get(tenant))
    for tenant, reason in plan.failed.items():
        if tenant in prev:  # kept as published; a tenant never published is not one (its error is in "incremental")
            manifest["tenants"][tenant] = {**prev[tenant], "status": TenantStatus.FAILED.value, "error": reason}
    # the version this one was built from: a serving replica follows these links back to the
    # version it has loaded to keep the tenants no version in between rebuilt (TenantCache.refresh)
    manifest.update(base_version=(base or {}).get("version"), build_key=key, forgotten=forget.to_json(),
                    incremental=plan.to_json(),
                    nodes_by_kind=node_kinds, edges_by_kind=edge_kinds,
                    tenant_timings_s={s["tenant_id"]: s.get("timings", {}) for s in summaries
                                      if s["tenant_id"] in built},
                    tenant_nodes={s["tenant_id"]: s.get("node_id") for s in summaries if s["tenant_id"] in built},
                    # per rebuilt tenant: what its tenant steps copied from its published version
                    tenant_reused={s["tenant_id"]: s["reused"] for s in summaries
                                   if s["tenant_id"] in built and s.get("reused")})
    return manifest


@locked("out")
def run_build(cfg: MemlibConfig, input_path: str | Path, fmt: str, out: str | Path, *, full: bool = True,
              address: str | None = None, num_cpus: int | None = None, recipe: str = DEFAULT_RECIPE,
              delete: str | Path | None = None, progress: Progress = _quiet) -> dict[str, Any]:
    """Build the next store version and publish it; returns the manifest.

    ``full`` (default, ``memlib build``): every tenant of the input is rebuilt from scratch (no
    carry-over, no kept session outputs reused); the published version holds exactly the input's
    tenants (removing published ones only within ``nightly.max_removed_share``). A full build is
    this run against an empty store. Incremental (``full=False``, ``memlib build --incremental``):
    unchanged tenants are carried over, and a changed tenant recomputes only its new or changed
    sessions before its tenant-level stages."""
    get_recipe(recipe)
    pl.thread_pool_size()  # polars sizes its pool now: Ray's start sets POLARS_MAX_THREADS=1 for a moment
    timer, wall = WallTimer(), time.perf_counter()
    base = read_manifest(out)
    kept = kept_space(cfg.embed, base)
    if kept is not None:  # the config names no embedder: the store's (never switched by omission)
        cfg = cfg.model_copy(update={"embed": kept})
        progress("embed", {"backend": kept.backend, "store": str(out)})
    new_space = space_change(base, cfg.embed, str(out))
    forget = ForgetList.load(delete, (base or {}).get("forgotten"))
    writer = ResumableWriter(out, dim=cfg.embed.dim)
    key = build_key(cfg, recipe)
    with (discard_if_refused(writer), timer.span(Phase.READ),
          staged_input(input_path, cfg.io.staging_dir) as local_input):
        sources = input_sources(local_input, str(fmt))
        read = fingerprint_sources(sources, str(fmt), cfg, forget)
        check_readable(input_path, sources, read, full=full)  # an unusable input publishes nothing
        plan = make_plan(None if full else base, read.hashes, read.sources, key,
                         {} if full else writer.done_markers(), read.failed)
        settle_missing(plan, base, forget.tenants, complete=full or cfg.nightly.input_is_complete,
                       max_share=cfg.nightly.max_removed_share)
        rebuild_damaged(plan, writer.base)
        if new_space and plan.carry:  # every tenant of the input is rebuilt (new build key); these would not be
            raise StoreError(f"{new_space}; {len(plan.carry)} published tenant(s) missing from the input "
                             f"({', '.join(plan.carry[:5])}) would keep the old model's vectors, and a store cannot "
                             f"mix the vectors of two models. To switch, rebuild the store whole (`memlib build` "
                             f"without --incremental)")
        # Ray starts (seconds of its processes coming up) while the input is sharded and the
        # pending sessions are packed into blocks; a run with nothing to build never starts it
        with ThreadPoolExecutor(1, thread_name_prefix="memlib-shard") as reader:
            sharded = reader.submit(shard_and_prepare, sources, str(fmt), cfg, writer, plan, forget, read.failed,
                                    key, full=full)
            target = None
            if plan.build:
                with timer.span(Phase.RAY_START):
                    target = init_ray(address, num_cpus, token_auth=cfg.ray.local_token_auth)
            shards, to_build, quarantine, prepared = sharded.result()
    progress("plan", plan.to_json())
    session_stats: dict[str, Any] = {}
    # Lance is first needed when the tenants are written: its restore (and lancedb's import, 1.3-2.4
    # CPU-s) runs while the tenant stages do, once the first tenant is done: not while the actors
    # start and load their models, nor before Ray's processes are started (lancedb warns about forks)
    with ThreadPoolExecutor(1, thread_name_prefix="memlib-lance") as background:
        lance_restored: list[Future] = []

        def restore_once() -> None:
            if not lance_restored:
                lance_restored.append(background.submit(writer.start_new_space) if new_space else
                                      background.submit(writer.restore_published, base))

        with timer.span(Phase.TENANTS):
            summaries = build_tenants(writer, to_build, cfg, recipe, plan, key, target, progress,
                                      reuse=not full, stats=session_stats, prepared=prepared,
                                      tenant_done=restore_once)
        lance_restored[0].result()
    summaries += [{**m["summary"], "status": TenantStatus.RESUMED.value} for m in plan.resume.values()]
    done = {s["tenant_id"] for s in summaries}
    ok_shards = [s for s in shards if s.tenant_id in done]
    prev = (base or {}).get("tenants", {})
    lost = sorted(t for t in plan.failed if t in prev)
    if new_space and lost:  # their published rows are in the old space: they cannot be carried into the new one
        raise StoreError(f"{new_space}, and {len(lost)} published tenant(s) failed to build ({', '.join(lost[:5])}): "
                         f"a store changes its vector space only whole, so nothing was published "
                         f"(the published version is unchanged). Their errors: {_reasons(plan, lost)}")
    remove_unkeepable(writer, plan, forget, [t for t in plan.failed if t in prev])
    drop_partitions(writer, list(plan.failed) + list(plan.removed))
    graph_info = {"status": "built", "tenants": len(ok_shards), "where": "tenant stage"}
    with timer.span(Phase.WRITE):
        kept = plan.carry + [t for t in plan.failed if t in prev]
        carried = (writer.carry_over(kept, part_turns=cfg.ray.tenant_batch_turns, purge=_purged(plan, forget, base))
                   if kept else Carried())
        parts = {**carried.parts, **{s["tenant_id"]: s["part"] for s in summaries}}
        writer.prune_parts(parts, check={s["part"] for s in summaries if s["tenant_id"] in plan.resume})
        held = dict(carried.held)
        for s in sorted(summaries, key=lambda s: s["tenant_id"]):
            if parts[s["tenant_id"]] == s["part"]:
                held.setdefault(s["part"], []).append(s["tenant_id"])
        _write_lance(writer, summaries, parts, plan.gone + sorted(forget.tenants & set(prev)),
                     cfg.io.lance_rows_per_commit)
        drop_staging(writer)
        shutil.rmtree(writer.version_dir / DONE_DIR, ignore_errors=True)
    with timer.span(Phase.INDEX):
        writer.index_nodes(incremental=not full and base is not None and not new_space,
                           merge_rows=cfg.io.index_merge_rows,
                           vector_index=cfg.io.vector_index, max_fragments=cfg.io.max_fragments)
    with timer.span(Phase.PUBLISH):  # what the manifest counts (its own write is not timed in it)
        version = StoreReader(writer.path, {"version": writer.version, PART_TENANTS_KEY: held,
                                            "tenants": {t: {PART_KEY: p} for t, p in parts.items()}})
        # carried over, and failed but kept as published: their rows are in this version, so in its counts
        kept_tenants = plan.carry + [t for t in plan.failed if t in prev]
        counted = writer.base.tenant_counts() if kept_tenants and writer.base is not None else {}
        carried = [_carried_summary(t, prev[t], counted.get(t)) for t in kept_tenants]
        kinds, questions = store_counts(version, summaries + carried)
        writer.write_tenant_counts({s["tenant_id"]: {k: s[k] for k in TENANT_COUNTS} for s in summaries + carried})
    timings = {**timer.rounded(), "total": round(time.perf_counter() - wall, 3)}
    manifest = build_manifest(cfg=cfg, recipe=recipe, input_path=str(input_path), fmt=str(fmt),
                              fingerprints=plan.hashes, summaries=summaries + carried,
                              questions=questions, quarantine_by_reason=quarantine,
                              timings=timings, graph=graph_info)
    manifest = _finish_manifest(manifest, plan, base, key, forget, *kinds, summaries)
    for tenant, entry in manifest["tenants"].items():
        entry[PART_KEY] = parts[tenant]
    manifest[PART_TENANTS_KEY] = {p: held[p] for p in sorted(set(parts.values()))}
    manifest["sessions"] = session_stats
    manifest["session_build_key"] = session_build_key(cfg, key)
    published = writer.publish(manifest)
    progress("published", {"version": published["version"], "store": str(out), **plan.to_json()})
    return published


def _purged(plan: Plan, forget: ForgetList, base: dict[str, Any] | None) -> set[str]:
    """Tenants none of whose published rows may stay in the new version, not even dead in a carried
    part: those deleted, and those forgotten in whole or in part by this run."""
    before = ForgetList.load(None, (base or {}).get("forgotten"))
    return (set(plan.gone) | set(plan.removed) | (forget.tenants - before.tenants)
            | {t for t, _ in forget.conversations - before.conversations})


def _reasons(plan: Plan, tenants: list[str]) -> str:
    return "; ".join(f"{t}: {plan.failed[t]}" for t in tenants[:3])


def run_incremental(cfg: MemlibConfig, input_path: str | Path, fmt: str, out: str | Path,
                    **options: Any) -> dict[str, Any]:
    """:func:`run_build` with ``full=False``: ``memlib build --incremental``."""
    return run_build(cfg, input_path, fmt, out, full=False, **options)
