"""``from jobs.build import run_build``: the memory build's entrypoint. Its driver is the package
:mod:`jobs.builder` (a directory named ``build`` is skipped by pytest and ruff:
docs/decisions/0029-build-driver-package.md)."""
from __future__ import annotations

from jobs.builder import run_build
from jobs.local_ray import RayTarget, init_ray

__all__ = ["RayTarget", "init_ray", "run_build"]
