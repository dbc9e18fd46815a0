"""Entrypoint of the memory build: read -> shard by tenant -> one Ray Data dataset of session
blocks and tenants (pipelines/staged_build.py; graph per tenant in the tenant operator) ->
Lance/Parquet -> indexes -> manifest -> publish. The driver is :mod:`jobs.nightly`; a full
build is its run with ``full``.

Local Ray by default (``ray.init(address="local")``); ``address`` or the RAY_ADDRESS
environment variable (read here, never in memlib/) targets a cluster.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from jobs.local_ray import start_local, workers_inherit
from memlib.compose.recipe import DEFAULT_RECIPE
from memlib.config import MemlibConfig
from pipelines.operators import WORKER_ENV

log = logging.getLogger("memlib.compose")
Progress = Callable[[str, dict[str, Any]], None]


def _quiet(event: str, info: dict[str, Any]) -> None:
    log.info("%s %s", event, info)


@dataclass(frozen=True)
class RayTarget:
    """The Ray instance a build runs on: the CPUs it may use, and whether its workers inherit the
    build operators' environment (``pipelines.operators.WORKER_ENV``; true for the local instance
    this process starts, so the operators need no ``runtime_env``)."""
    cpus: int
    worker_env_inherited: bool = False


def init_ray(address: str | None, num_cpus: int | None, *, token_auth: bool = True) -> RayTarget:
    """Connect to (or start) Ray. A local instance is started with free ports, the build
    operators' worker environment and, with ``token_auth`` (``ray.local_token_auth``), a fresh
    token (:mod:`jobs.local_ray`)."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            start_local(num_cpus, token_auth=token_auth, worker_env=WORKER_ENV)
    ray.data.DataContext.get_current().enable_progress_bars = True
    return RayTarget(int(num_cpus or ray.cluster_resources().get("CPU", 1)), workers_inherit(WORKER_ENV))


def run_build(cfg: MemlibConfig, input_path: str | Path, fmt: str, out: str | Path, address: str | None = None,
              num_cpus: int | None = None, *, recipe: str = DEFAULT_RECIPE,
              progress: Progress = _quiet) -> dict[str, Any]:
    """Build a store version from ``input_path`` from scratch and publish it; returns the manifest.

    One driver for every build: this is :func:`jobs.nightly.run_incremental` with ``full=True``
    (every tenant of the input rebuilt, no kept session outputs reused)."""
    from jobs.nightly import run_incremental

    return run_incremental(cfg, input_path, fmt, out, address=address, num_cpus=num_cpus, recipe=recipe,
                           progress=progress, full=True)
