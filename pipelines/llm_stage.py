"""LLM extraction on Ray: one rate limiter shared by every worker, per-actor clients, dry run.

``shared_limiter(cfg)`` gets or creates a named detached-free Ray actor holding a
:class:`memlib.llm.limiter.LocalRateLimiter`; :class:`ActorRateLimiter` is the worker-side
proxy implementing memlib's ``RateLimiter`` interface (it asks the actor for a start slot and
sleeps locally), so the configured requests/tokens per minute hold across all workers.
``llm_extras(cfg, store_dir)`` is what a build actor puts into ``ExtractionContext.extras``
(built once per actor). ``dry_run(turns, kept, cfg)`` plans the calls and estimates tokens
and cost without sending anything.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import ray

from memlib.config import MemlibConfig
from memlib.llm.limiter import LocalRateLimiter

LIMITER_NAME = "memlib-llm-rate-limiter"
CACHE_SUBDIR = "llm_cache"


@ray.remote(num_cpus=0)
class RateLimiterActor:
    def __init__(self, requests_per_minute: float, tokens_per_minute: float):
        self._limiter = LocalRateLimiter(requests_per_minute, tokens_per_minute)

    def reserve(self, tokens: int) -> float:
        return self._limiter.reserve(tokens)


class ActorRateLimiter:
    """Worker-side proxy; picklable (holds only the actor handle)."""

    def __init__(self, handle: Any):
        self.handle = handle

    def reserve(self, tokens: int) -> float:
        return ray.get(self.handle.reserve.remote(tokens))


def shared_limiter(cfg: MemlibConfig, name: str = LIMITER_NAME) -> ActorRateLimiter:
    """The run's limiter actor (created on first use, found by name afterwards)."""
    handle = RateLimiterActor.options(name=name, get_if_exists=True).remote(
        cfg.llm.requests_per_minute, cfg.llm.tokens_per_minute)
    return ActorRateLimiter(handle)


def cache_dir(store_dir: str | Path) -> Path:
    """The LLM response cache lives on the store's filesystem, beside the versions."""
    return Path(store_dir) / CACHE_SUBDIR


def llm_extras(cfg: MemlibConfig, store_dir: str | Path, limiter: ActorRateLimiter | None = None) -> dict[str, Any]:
    """``ExtractionContext.extras`` for a worker: one client (cache + shared limiter) per actor."""
    from memlib.extract.llm_common import CLIENT_KEY
    from memlib.llm.client import LLMClient

    client = LLMClient(cfg.llm, cache_dir=cache_dir(store_dir), limiter=limiter or shared_limiter(cfg))
    return {CLIENT_KEY: client}


def drain_llm_calls(extras: dict[str, Any]) -> pa.Table | None:
    """The ``llm_calls`` rows produced since the last drain (for the store sink)."""
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
