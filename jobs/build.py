"""Entrypoint of the memory build: read -> shard by tenant -> one Ray Data dataset of session
blocks and tenants (pipelines/staged_build.py; graph per tenant in the tenant operator) ->
Lance/Parquet -> indexes -> manifest -> publish. The driver is :mod:`jobs.nightly`; a full
build is its run with ``full``.

Local Ray by default (``ray.init(address="local")``); ``address`` or the RAY_ADDRESS
environment variable (read here, never in memlib/) targets a cluster.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.local_ray import RayTarget, init_ray  # noqa: F401 - imported from here by callers
from memlib.compose.recipe import DEFAULT_RECIPE
from memlib.config import MemlibConfig

log = logging.getLogger("memlib.compose")
Progress = Callable[[str, dict[str, Any]], None]


def _quiet(event: str, info: dict[str, Any]) -> None:
    log.info("%s %s", event, info)


def run_build(cfg: MemlibConfig, input_path: str | Path, fmt: str, out: str | Path, address: str | None = None,
              num_cpus: int | None = None, *, recipe: str = DEFAULT_RECIPE,
              progress: Progress = _quiet) -> dict[str, Any]:
    """Build a store version from ``input_path`` from scratch and publish it; returns the manifest.

    One driver for every build: this is :func:`jobs.nightly.run_incremental` with ``full=True``
    (every tenant of the input rebuilt, no kept session outputs reused)."""
    from jobs.nightly import run_incremental

    return run_incremental(cfg, input_path, fmt, out, address=address, num_cpus=num_cpus, recipe=recipe,
                           progress=progress, full=True)
