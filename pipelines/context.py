"""The build context: what one run decides once and every stage of it reads.

The driver (jobs/builder/driver.py) makes it at the start of a run. From then on, the staged build
and its operators take it whole, so no stage gets these values through a parameter list.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from memlib.compose.recipe import DEFAULT_RECIPE
from memlib.config import MemlibConfig
from pipelines.shard import STAGED


@dataclass(frozen=True)
class BuildContext:
    """One run's config, recipe, store layout, keys, reuse rule and Ray target.

    ``cfg`` is the config the run builds with. When the given config names no embedder, it is
    the store's embedder (memlib.embed.space.kept_space). The run derives it once; nothing
    rewrites it later.
    """
    cfg: MemlibConfig
    recipe: str = DEFAULT_RECIPE
    store: str = ""             # the store's root directory
    session_key: str = ""       # what session outputs are kept under (memlib.compose.keys.session_build_key)
    build_key: str = ""         # what decides a tenant's output (memlib.compose.keys.build_key)
    reuse: bool = True          # kept session outputs and the published build may be reused (False: a full build)
    version_dir: str = ""       # the unpublished version this run writes
    cpus: int | None = None     # the Ray target's CPUs (jobs/local_ray.py RayTarget; None: no Ray yet)
    worker_env_inherited: bool = False  # its workers have the operators' environment already

    @classmethod
    def of(cls, ctx: BuildContext | MemlibConfig, *fields: str) -> BuildContext:
        """``ctx`` itself, or a context made of a config and the fields that follow it (recipe,
        store, session key): an operator made on its own, outside a run."""
        return ctx if isinstance(ctx, BuildContext) else cls(ctx, *fields)

    @property
    def reuses_tenants(self) -> bool:
        """Whether a tenant's steps may start from its published build (a run that only added or
        removed turns): then they pool only what changed, and numba's loops are not warmed ahead."""
        return self.reuse and self.cfg.ray.reuse_tenant_build

    @property
    def work_dir(self) -> Path:
        """Where the session pass's block files and failure markers go while the dataset runs."""
        return Path(self.version_dir) / STAGED / "_work"

    def on_ray(self, cpus: int, worker_env_inherited: bool) -> BuildContext:
        """This context, with the Ray target it runs on. Ray starts while the input is sharded
        (docs/decisions/0024-nightly-fixed-costs.md), so the target is known only after that."""
        return dataclasses.replace(self, cpus=cpus, worker_env_inherited=worker_env_inherited)
