"""The build's tenants phase: shard the input by tenant, then build the tenants to build on Ray.

Sharding and the packing of pending sessions into blocks need no Ray: they run in a driver
thread while Ray starts (:func:`shard_and_prepare`). :func:`build_tenants` runs the staged
build (:mod:`pipelines.staged_build`) and marks each finished tenant done (:mod:`jobs.builder.resume`).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.builder.guards import keep_against_quarantine
from jobs.builder.plan import source_names
from jobs.builder.run import Run, Sharded
from memlib.io.errors import InputError
from pipelines.inline import run_inline
from pipelines.shard import QUARANTINE_PART, TenantShard, shard_input
from pipelines.staged_build import prepare_staged, run_staged


def allow_long_tenants() -> None:
    """Disable Ray Data's no-progress timeout (1800 s by default) for this driver: one tenant is one
    task, and a LongMemEval-l-sized tenant (~24k turns) builds for longer than that without any
    block moving. A tenant that fails still fails its task (and is reported failed)."""
    import ray

    ray.data.DataContext.get_current().execution_no_progress_timeout_s = -1


def shard_all(run: Run, sources: list[Path], skip: dict[str, str]) -> tuple[list[TenantShard], dict, Any]:
    """Shard every readable file (not those in ``skip``); a tenant found in several files gets their
    turns merged. A file failing now fails its tenants (their published data is kept), or stops a
    full or one-file build."""
    shards, seen, quarantine, merged = {}, {}, {}, {}
    plan = run.plan
    todo = set(plan.build) | set(plan.resume)
    for src in sources:
        if src.name in skip:
            continue
        part = QUARANTINE_PART if len(sources) == 1 else src.stem
        try:
            res = shard_input(src, run.source[1], run.ctx.cfg, run.writer, keep_rows=run.forget.keep_rows,
                              rebuild=todo.__contains__, quarantine_part=part, merged=merged)
        except (InputError, OSError, ValueError) as exc:
            if run.full or len(sources) == 1:
                raise exc if isinstance(exc, InputError) else InputError(src.name, str(exc)[:300]) from exc
            for t, names in plan.sources.items():
                if src.name in source_names(names):
                    plan.fail(t, f"input file {src.name} unreadable: {str(exc)[:200]}")
            continue
        shards.update({s.tenant_id: s for s in res.shards})
        for tenant, n in res.seen.items():
            seen[tenant] = seen.get(tenant, 0) + n
        for k, v in res.quarantine_by_reason.items():
            quarantine[k] = quarantine.get(k, 0) + v
    return list(shards.values()), seen, quarantine


def shard_and_prepare(run: Run, sources: list[Path], skip: dict[str, str]) -> Sharded:
    """Shard the input, then pack the pending sessions of the tenants to build into blocks (no Ray
    needed: it runs while Ray starts)."""
    plan, forget = run.plan, run.forget
    shards, seen, quarantine = shard_all(run, sources, skip)
    for tenant in plan.build:
        if seen.get(tenant, 0) == 0 and tenant not in plan.failed:
            plan.fail(tenant, "no valid turns left in the input (every record forgotten or quarantined)"
                      if forget.conversations_of(tenant) else
                      "no valid turns in the input (every record quarantined)")
    keep_against_quarantine(run.writer, plan, forget, shards)
    to_build = [s for s in shards if s.tenant_id not in plan.resume and s.tenant_id not in plan.failed]
    return Sharded(shards, to_build, quarantine, prepare_staged(to_build, run.ctx) if to_build else None)


def build_tenants(run: Run, sharded: Sharded, stats: dict[str, Any],
                  tenant_done: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
    """The staged build of the tenants to build (session pass, then tenant stages); a tenant with no
    summary afterwards failed (its block errored). ``stats`` receives the session pass's figures;
    ``tenant_done`` is called as each tenant ends and once after the last."""
    plan, progress, shards = run.plan, run.progress, sharded.to_build
    for block, why in sorted((sharded.sessions.damaged if sharded.sessions else {}).items()):
        progress("kept_damaged", {"block": block, "reason": why})
    summaries = []
    if shards:
        progress("tenants_start", {"tenants": len(shards), "blocks": len(sharded.sessions.blocks)
                                   if sharded.sessions else 0})
        if run.inline:
            built = run_inline(shards, run.ctx, sharded.sessions, stats=stats, on_block=lambda b: progress("block", b))
        else:
            assert run.ctx.cpus is not None, "shards to build need Ray"
            import ray

            ray.data.DataContext.get_current().max_errored_blocks = 0  # operators report failures in their rows
            allow_long_tenants()
            built = run_staged(shards, run.ctx, stats=stats, plan=sharded.sessions,
                               on_block=lambda b: progress("block", b))
        for s in built:
            tenant_done()
            if "error" in s:
                plan.fail(s["tenant_id"], f"tenant build raised {s['error']}")
                progress("tenant_failed", s)
                continue
            run.writer.mark_done(s["tenant_id"], {"input_hash": plan.hashes[s["tenant_id"]],
                                                  "build_key": run.ctx.build_key, "summary": s})
            summaries.append(s)
            progress("tenant", s)
    tenant_done()
    finished = {s["tenant_id"] for s in summaries}
    for shard in shards:
        if shard.tenant_id not in finished and shard.tenant_id not in plan.failed:
            plan.fail(shard.tenant_id, "tenant build raised (see the Ray task logs)")
    return summaries

