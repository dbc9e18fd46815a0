"""The build's last phases: settle the failed tenants, write the version (parts, Lance), index it,
count it and publish its manifest."""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.builder.counts import store_counts
from jobs.builder.guards import drop_partitions, remove_unkeepable
from jobs.builder.plan import ForgetList, TenantStatus
from jobs.builder.resume import DONE_DIR
from jobs.builder.run import Built, Run
from memlib.compose.manifest import TENANT_COUNTS, VersionFacts, build_manifest
from memlib.compose.recipe import Phase
from memlib.io.checksums import DamagedFileError
from memlib.io.lance_checks import LANCE_DIGEST_KEY
from memlib.io.reader_checks import LANCE_TABLES
from memlib.io.store import PART_KEY, PART_TENANTS_KEY, Carried, StoreError, StoreReader, StoreWriter
from pipelines.store_sink import drop_staging


@dataclass
class Layout:
    """Where the version holds each tenant: tenant -> part, and part -> its tenants."""
    parts: dict[str, str]
    held: dict[str, list[str]]


def write_lance(writer: StoreWriter, summaries: list[dict[str, Any]], layout: Layout, remove: list[str],
                rows_per_commit: int) -> None:
    """Replace rebuilt tenants' nodes and delete removed tenants' in commits that follow rows (one
    delete, then batches of ``rows_per_commit`` rows); carried tenants stay untouched. A rebuilt
    tenant whose summary has ``lance_delete`` replaces only its changed rows: those ids are
    deleted and its staged rows (the changed and new ones) added (memlib.io.lance_delta). Each staged
    file holds one row's tenants (a part) and is read when its batch is written; only the tenants
    the version keeps in that part are taken (an interrupted run's part may hold a tenant rebuilt
    since)."""
    staged: dict[str, list[str]] = {}
    for s in summaries:
        if layout.parts.get(s["tenant_id"]) == s["part"]:
            staged.setdefault(s["nodes_path"], []).append(s["tenant_id"])

    def tables():
        for path, tenants in sorted(staged.items()):
            t = pq.read_table(path)
            yield t.filter(pc.is_in(t.column("tenant_id"), value_set=pa.array(tenants, pa.string())))

    whole = [s["tenant_id"] for s in summaries if s.get("lance_delete") is None]
    rows = {s["tenant_id"]: s["lance_delete"] for s in summaries if s.get("lance_delete") is not None}
    writer.write_tenants(whole + list(remove), tables(), rows_per_commit=rows_per_commit, remove_rows=rows)


def lance_indexes_whole(run: Run) -> bool:
    """Whether the published Lance versions' index and manifest files have the checksums written with
    them; a run over damaged ones indexes its tables anew (new files) instead of merging into them."""
    base = run.writer.base
    for name in LANCE_TABLES if base is not None else ():
        try:
            base.check_lance_files(name)
        except DamagedFileError as exc:
            run.progress("lance_damaged", {"table": name, "reason": str(exc)})
            return False
    return True


def carried_summary(tenant: str, old: dict[str, Any], counts: dict[str, Any] | None) -> dict[str, Any]:
    """A carried tenant's summary: its published totals, and its counts by kind when its version
    kept them (``counts``)."""
    return {"tenant_id": tenant, **{k: old.get(k, 0) for k in ("turns", "nodes", "edges", "segments")},
            **(counts or {}), **({LANCE_DIGEST_KEY: old[LANCE_DIGEST_KEY]} if LANCE_DIGEST_KEY in old else {})}


def purged(run: Run) -> set[str]:
    """Tenants none of whose published rows may stay in the new version, not even dead in a carried
    part: those deleted, and those forgotten in whole or in part by this run."""
    plan, forget = run.plan, run.forget
    before = ForgetList.load(None, (run.base or {}).get("forgotten"))
    return (set(plan.gone) | set(plan.removed) | (forget.tenants - before.tenants)
            | {t for t, _ in forget.conversations - before.conversations})


def settle_failures(run: Run) -> None:
    """A store changes its vector space only whole: a failed published tenant then stops the run.
    Otherwise a failed tenant keeps its published data (unless it holds a forgotten conversation:
    removed), and nothing it wrote stays in the new version."""
    plan, writer = run.plan, run.writer
    lost = sorted(t for t in plan.failed if t in run.published)
    if run.new_space and lost:  # their published rows are in the old space: they cannot be carried into the new one
        reasons = "; ".join(f"{t}: {plan.failed[t]}" for t in lost[:3])
        raise StoreError(f"{run.new_space}, and {len(lost)} published tenant(s) failed to build "
                         f"({', '.join(lost[:5])}): a store changes its vector space only whole, so nothing was "
                         f"published (the published version is unchanged). Their errors: {reasons}")
    remove_unkeepable(writer, plan, run.forget, [t for t in plan.failed if t in run.published])
    drop_partitions(writer, list(plan.failed) + list(plan.removed))


def write_version(run: Run, summaries: list[dict[str, Any]]) -> Layout:
    """Carry the kept tenants' parts over, drop the parts nothing holds, write Lance."""
    cfg, plan, writer = run.ctx.cfg, run.plan, run.writer
    kept = run.kept_as_published()
    carried = (writer.carry_over(kept, part_turns=cfg.ray.tenant_batch_turns, purge=purged(run))
               if kept else Carried())
    if carried.unremembered:  # a store written before memory views gets them as its parts are carried
        from memlib.graph.memory_arrays import memory_views_from_tables

        memory_views_from_tables(writer.base, writer.version_dir, carried.unremembered)
    parts = {**carried.parts, **{s["tenant_id"]: s["part"] for s in summaries}}
    writer.prune_parts(parts, check={s["part"] for s in summaries if s["tenant_id"] in plan.resume})
    held = dict(carried.held)
    for s in sorted(summaries, key=lambda s: s["tenant_id"]):
        if parts[s["tenant_id"]] == s["part"]:
            held.setdefault(s["part"], []).append(s["tenant_id"])
    layout = Layout(parts, held)
    write_lance(writer, summaries, layout, plan.gone + sorted(run.forget.tenants & set(run.published)),
                cfg.io.lance_rows_per_commit)
    drop_staging(writer)
    shutil.rmtree(writer.version_dir / DONE_DIR, ignore_errors=True)
    return layout


def finish_manifest(manifest: dict[str, Any], run: Run, kinds: tuple[dict[str, int], dict[str, int]],
                    summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's own entries of the manifest: each tenant's status, source and input hash, the failed
    ones kept as published, the plan, the keys and what each rebuilt tenant did."""
    plan, prev = run.plan, run.published
    node_kinds, edge_kinds = kinds
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
    manifest.update(base_version=(run.base or {}).get("version"), build_key=run.ctx.build_key,
                    forgotten=run.forget.to_json(), incremental=plan.to_json(),
                    nodes_by_kind=node_kinds, edges_by_kind=edge_kinds,
                    tenant_timings_s={s["tenant_id"]: s.get("timings", {}) for s in summaries
                                      if s["tenant_id"] in built},
                    tenant_nodes={s["tenant_id"]: s.get("node_id") for s in summaries if s["tenant_id"] in built},
                    # per rebuilt tenant: what its tenant steps copied from its published version
                    tenant_reused={s["tenant_id"]: s["reused"] for s in summaries
                                   if s["tenant_id"] in built and s.get("reused")})
    return manifest


def publish(run: Run, built: Built) -> dict[str, Any]:
    """Write, index, count and publish the version; returns the published manifest."""
    ctx, plan, writer, timer, summaries = run.ctx, run.plan, run.writer, run.timer, built.summaries
    settle_failures(run)
    with timer.span(Phase.WRITE):
        layout = write_version(run, summaries)
    with timer.span(Phase.INDEX):
        writer.index_nodes(incremental=(not run.full and run.base is not None and not run.new_space
                                        and lance_indexes_whole(run)),
                           merge_rows=ctx.cfg.io.index_merge_rows,
                           vector_index=ctx.cfg.io.vector_index, max_fragments=ctx.cfg.io.max_fragments)
    with timer.span(Phase.PUBLISH):  # what the manifest counts (its own write is not timed in it)
        version = StoreReader(writer.path, {"version": writer.version, PART_TENANTS_KEY: layout.held,
                                            "tenants": {t: {PART_KEY: p} for t, p in layout.parts.items()}})
        # carried over, and failed but kept as published: their rows are in this version, so in its counts
        kept = run.kept_as_published()
        counted = writer.base.tenant_counts() if kept and writer.base is not None else {}
        carried = [carried_summary(t, run.published[t], counted.get(t)) for t in kept]
        kinds, questions = store_counts(version, summaries + carried)
        writer.write_tenant_counts({s["tenant_id"]: {k: s[k] for k in TENANT_COUNTS} for s in summaries + carried})
    timings = {**timer.rounded(), "total": round(time.perf_counter() - run.started, 3)}
    input_path, fmt = run.source
    facts = VersionFacts(input_path=str(input_path), fmt=str(fmt), fingerprints=plan.hashes, questions=questions,
                         quarantine_by_reason=built.quarantine, timings=timings, graph=built.graph)
    manifest = finish_manifest(build_manifest(ctx.cfg, ctx.recipe, summaries + carried, facts), run, kinds,
                               summaries)
    for tenant, entry in manifest["tenants"].items():
        entry[PART_KEY] = layout.parts[tenant]
    manifest[PART_TENANTS_KEY] = {p: layout.held[p] for p in sorted(set(layout.parts.values()))}
    manifest["sessions"] = built.session_stats
    manifest["session_build_key"] = ctx.session_key
    published = writer.publish(manifest)
    run.progress("published", {"version": published["version"], "store": run.out, **plan.to_json()})
    return published
