"""One run of the build driver: its options, the state its phases hand on, and what they produce."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.builder.plan import ForgetList, Plan
from jobs.builder.resume import ResumableWriter
from memlib.compose.recipe import DEFAULT_RECIPE
from memlib.compose.timer import WallTimer
from pipelines.context import BuildContext
from pipelines.shard import TenantShard
from pipelines.staged_build import SessionPlan

log = logging.getLogger("memlib.nightly")
Progress = Callable[[str, dict[str, Any]], None]


def quiet(event: str, info: dict[str, Any]) -> None:
    log.info("%s %s", event, info)


class PhaseTimer(WallTimer):
    """The run's stage timings, each phase also reported as it ends (a ``phase`` event with its
    name and seconds), so a display prints one line per phase."""

    def __init__(self, progress: Progress = quiet) -> None:
        super().__init__()
        self.progress = progress

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        with super().span(name):
            yield
        self.progress("phase", {"name": getattr(name, "value", name), "seconds": time.perf_counter() - start})


@dataclass(frozen=True)
class BuildOptions:
    """The options of :func:`jobs.builder.driver.run_build` besides its input, store and ``full``."""
    address: str | None = None       # a Ray cluster (default: local, or RAY_ADDRESS)
    num_cpus: int | None = None      # CPUs of a local Ray
    recipe: str = DEFAULT_RECIPE
    delete: str | Path | None = None  # the forget list: tenants and tenant/conversation ids
    progress: Progress = quiet
    quiet_ray: bool = False          # Ray's own log lines hidden (jobs/ray_logs.py): the CLI's default


@dataclass
class Run:
    """One run's context and the state its phases hand on."""
    ctx: BuildContext
    writer: ResumableWriter
    base: dict[str, Any] | None       # the published manifest the run starts from
    forget: ForgetList
    source: tuple[Any, str]           # (input path, format)
    out: str                          # the store as the caller named it (in messages)
    full: bool
    new_space: str | None             # why the run's vector space is not the store's (None: it is)
    progress: Progress = quiet
    plan: Plan = field(default_factory=Plan)
    timer: WallTimer = field(default_factory=WallTimer)
    started: float = field(default_factory=time.perf_counter)
    inline: bool = False              # built in this process, without Ray (pipelines/inline.py)
    prefetch: Any = None              # its tenants' published builds read ahead (pipelines/prefetch.py)

    def close_prefetch(self) -> None:
        if self.prefetch is not None:
            self.prefetch.close()
            self.prefetch = None

    @property
    def published(self) -> dict[str, Any]:
        """The published manifest's tenants (empty for a new store)."""
        return (self.base or {}).get("tenants", {})

    def kept_as_published(self) -> list[str]:
        """The tenants whose published rows this version keeps: carried over, and failed but published."""
        return self.plan.carry + [t for t in self.plan.failed if t in self.published]


@dataclass
class Sharded:
    """The input sharded by tenant: every shard, those to build, the quarantine counts and the
    pending sessions packed into blocks (None: nothing to build)."""
    shards: list[TenantShard]
    to_build: list[TenantShard]
    quarantine: dict[str, int]
    sessions: SessionPlan | None


@dataclass
class Built:
    """What the tenants phase produced: the summaries of the tenants built and resumed, the
    session pass's figures and the manifest's graph entry."""
    summaries: list[dict[str, Any]]
    quarantine: dict[str, int]
    session_stats: dict[str, Any]
    graph: dict[str, Any]
