"""LLM extraction on Ray: one rate limiter shared by every worker, per-actor clients, dry run.

``shared_limiter(cfg)`` creates the run's (non-detached) Ray actor holding a
:class:`memlib.llm.limiter.LocalRateLimiter`; :class:`ActorRateLimiter` is the worker-side
proxy implementing memlib's ``RateLimiter`` interface (it asks the actor for a start slot and
sleeps locally), so the configured requests/tokens per minute hold across all workers.
``llm_extras(cfg, store_dir)`` is what a build actor puts into ``ExtractionContext.extras``
(built once per actor). ``dry_run(turns, kept, cfg)`` plans the calls and estimates tokens
and cost without sending anything; ``dry_run_input(cfg, path, fmt, recipe)`` does so for a
whole build input (read + gate only: no embedding, no store, no call).
``call_summary(calls)`` condenses ``llm_calls`` rows for build summaries and the manifest.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memlib.compose.recipe import EXTRACTION, Step, get_recipe
from memlib.config import Backend, MemlibConfig
from memlib.llm.limiter import LocalRateLimiter

LIMITER_NAME = "memlib-llm-rate-limiter"
CACHE_SUBDIR = Path("cache") / "llm"


class RateLimiterActor:
    """The run's limiter, as a Ray actor's class (:func:`shared_limiter` makes it remote: Ray is
    imported by a run that calls an LLM, not by every build that imports this module)."""

    def __init__(self, requests_per_minute: float, tokens_per_minute: float):
        self._limiter = LocalRateLimiter(requests_per_minute, tokens_per_minute)

    def reserve(self, tokens: int) -> float:
        return self._limiter.reserve(tokens)


@functools.cache
def _remote_limiter(ray: Any) -> Any:
    return ray.remote(num_cpus=0)(RateLimiterActor)


class ActorRateLimiter:
    """Worker-side proxy; picklable (holds only the actor handle)."""

    def __init__(self, handle: Any):
        self.handle = handle

    def reserve(self, tokens: int) -> float:
        import ray

        return ray.get(self.handle.reserve.remote(tokens))


def shared_limiter(cfg: MemlibConfig, name: str | None = None) -> ActorRateLimiter:
    """A new limiter actor for one build run, shared by its workers through the handle the
    driver passes them (the driver's handle keeps it alive for the run).

    The default name is unique per call: a named actor found again with ``get_if_exists``
    could be the previous run's, already losing its last reference and about to die (seen as
    ``ActorDiedError`` in every tenant of the next build). ``name`` joins an existing one."""
    import uuid

    import ray

    name = name or f"{LIMITER_NAME}-{uuid.uuid4().hex[:12]}"
    handle = _remote_limiter(ray).options(name=name, get_if_exists=True).remote(
        cfg.llm.requests_per_minute, cfg.llm.tokens_per_minute)
    return ActorRateLimiter(handle)


def cache_dir(store_dir: str | Path) -> Path:
    """The LLM response cache lives on the store's filesystem, beside the versions."""
    return Path(store_dir) / CACHE_SUBDIR


def llm_steps(cfg: MemlibConfig, recipe: str | None = None) -> list[Step]:
    """The extraction steps that run with the LLM backend (within ``recipe`` when given)."""
    plan = set(get_recipe(recipe)) if recipe is not None else set(EXTRACTION)
    out = [s for s in EXTRACTION if s in plan and getattr(cfg, s.value).backend is Backend.LLM]
    if Step.REFLECTIONS in out and not cfg.reflections.enabled:
        out.remove(Step.REFLECTIONS)
    return out


def for_recipe(cfg: MemlibConfig, recipe: str) -> MemlibConfig:
    """``cfg`` with the LLM stages a recipe leaves out set to heuristic (what the build runs)."""
    off = [s for s in EXTRACTION if s not in set(get_recipe(recipe))]
    if not off:
        return cfg
    out = cfg.model_copy(deep=True)
    for s in off:
        getattr(out, s.value).backend = Backend.HEURISTIC
    return out


def llm_extras(cfg: MemlibConfig, store_dir: str | Path, limiter: ActorRateLimiter | None = None) -> dict[str, Any]:
    """``ExtractionContext.extras`` for a worker: one client (cache + shared limiter) per actor."""
    from memlib.extract.llm_common import CLIENT_KEY
    from memlib.llm.client import LLMClient

    if limiter is None:  # no run-wide limiter given: this worker limits its own calls
        limiter = LocalRateLimiter(cfg.llm.requests_per_minute, cfg.llm.tokens_per_minute)
    client = LLMClient(cfg.llm, cache_dir=cache_dir(store_dir), limiter=limiter)
    return {CLIENT_KEY: client}


def drain_llm_calls(extras: dict[str, Any]) -> pa.Table | None:
    """The ``llm_calls`` rows produced since the last drain (for the store sink)."""
    if not extras:  # a recipe without LLM steps: no client, and no import of the client's modules
        return None  # (openai's import took 1.1 s of a nightly's tenant actor, on its first tenant)
    from memlib.extract.llm_common import CLIENT_KEY

    client = extras.get(CLIENT_KEY)
    return client.drain_calls() if client is not None else None


def dry_run(turns: pa.Table, kept_turn_ids: frozenset[str] | None, cfg: MemlibConfig) -> dict[str, Any]:
    """Planned calls, estimated input/output tokens and cost; sends nothing."""
    from memlib.extract.base import ExtractionContext
    from memlib.extract.llm_common import CLIENT_KEY
    from memlib.extract.llm_plan import plan_calls
    from memlib.llm.client import LLMClient
    from memlib.llm.estimate import estimate
    from memlib.llm.limiter import NoLimit

    ctx = ExtractionContext(turns=turns, kept_turn_ids=kept_turn_ids, config=cfg,
                            extras={CLIENT_KEY: LLMClient(cfg.llm, limiter=NoLimit())})
    return estimate(plan_calls(ctx), cfg.llm).as_dict()


def call_summary(calls: pa.Table | None) -> dict[str, int]:
    """Counts of ``llm_calls`` rows: calls, ok / cached / error, prompt and completion tokens."""
    if calls is None or calls.num_rows == 0:
        return {}
    status = calls.column("status")
    out = {"calls": calls.num_rows,
           "prompt_tokens": int(pc.sum(calls.column("prompt_tokens")).as_py() or 0),
           "completion_tokens": int(pc.sum(calls.column("completion_tokens")).as_py() or 0)}
    for value in ("ok", "cached", "error"):
        out[value] = int(pc.sum(pc.equal(status, value)).as_py() or 0)
    return out


def _kept(turns: pa.Table, cfg: MemlibConfig, gated: bool) -> frozenset[str] | None:
    """Turn node ids the build's memory gate keeps (the gate is per turn: no embedding needed)."""
    if not gated:
        return None
    from memlib.text.gate import gate_flags

    return frozenset(turns.filter(gate_flags(turns, cfg.gate)).column("node_id").to_pylist())


def dry_run_input(cfg: MemlibConfig, input_path: str | Path, fmt: str, recipe: str) -> dict[str, Any]:
    """The dry run of a build: read + validate + gate each tenant, plan its LLM calls (rendered
    prompts, nothing sent), then estimate calls, input/output tokens and cost per task and in
    total. Writes nothing."""
    from memlib import schema
    from memlib.compose.reference import sort_turns
    from memlib.extract.base import ExtractionContext
    from memlib.extract.llm_common import CLIENT_KEY
    from memlib.extract.llm_plan import plan_calls
    from memlib.io.readers import iter_tenants
    from memlib.llm.client import LLMClient
    from memlib.llm.estimate import estimate
    from memlib.llm.limiter import NoLimit

    cfg = for_recipe(cfg, recipe)
    gated = Step.GATE in get_recipe(recipe)
    extras = {CLIENT_KEY: LLMClient(cfg.llm, limiter=NoLimit())}
    planned, tenants, turns_n, sessions = [], 0, 0, 0
    for result in iter_tenants(input_path, fmt, cfg.io):
        for tenant in result.tenant_ids:
            turns = result.turns.filter(pc.equal(result.turns.column("tenant_id"), tenant))
            if turns.num_rows == 0:
                continue
            turns = sort_turns(schema.conform(turns, schema.TURNS, name="turns"))
            ctx = ExtractionContext(turns=turns, kept_turn_ids=_kept(turns, cfg, gated), config=cfg, extras=extras)
            planned += plan_calls(ctx) if llm_steps(cfg) else []
            tenants += 1
            turns_n += turns.num_rows
            sessions += len(pc.unique(turns.column("session_id")))
    out = estimate(planned, cfg.llm).as_dict()
    out.update(tenants=tenants, turns=turns_n, sessions=sessions, model=cfg.llm.model, recipe=recipe,
               llm_steps=[s.value for s in llm_steps(cfg)])
    return out
