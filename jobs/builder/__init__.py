"""The memory build's driver, one package (docs/decisions/0029-build-driver-package.md).

``driver`` runs a build (:func:`run_build`; ``full=False`` is ``memlib build --incremental``),
``plan`` decides each tenant's fate, ``tenants`` shards the input and builds tenants on Ray,
``guards`` keeps bad or forgotten input from removing published memory, ``resume`` keeps an
interrupted version's finished tenants, ``lock`` lets one process write a store, ``counts``
sums a version's counts.
"""
from jobs.builder.driver import run_build, run_incremental
from jobs.builder.resume import DONE_DIR

__all__ = ["DONE_DIR", "run_build", "run_incremental"]
