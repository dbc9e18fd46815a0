"""``memlib bench build``: build cost against its floor, one pass of the token encoder.

Prints one JSON line: build_s (the whole `memlib build` job: Ray start, read, session pass,
tenant stages, graph, Lance write, indexes, publish), floor_s (one pass of the default token
encoder -- the int8 MiniLM that ``auto`` uses -- over the same turn texts with every core,
after a warm-up, same run: the faster of intra-op threads with length-ordered batches and one
process per core encoding texts one by one, both reported; jobs/bench/embed_floor.py), floor_ratio =
build_s / floor_s, turns_per_s, the session pass's figures, and peak_rss_mb (driver plus
every child process: Ray's GCS, raylet and workers, sampled every 0.25 s).

``--ray-overhead`` adds Ray's own cost, measured in the same run (:mod:`jobs.bench.ray_overhead`): the
build's operator graph and the smallest actor-pool pipeline, each run empty on a fresh local
instance (wall and CPU seconds), and ``floor_ratio_bound``: the least floor_ratio a build of this
design could reach on these cores if nothing but Ray's overhead and the embed and session-local
passes' CPU seconds cost anything (``_minimal``: with the smallest pipeline's overhead instead).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.common import ConfigOpt, SetOpt, get_config


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("build")
    def bench_build(
        input: Annotated[Path, typer.Option("--input", "-i")] = Path("../shared/data/locomo_dev3.json"),
        format: Annotated[str, typer.Option("--format", "-f")] = "locomo",
        config: ConfigOpt = None,
        set_: SetOpt = None,
        num_cpus: Annotated[Optional[int], typer.Option("--num-cpus")] = None,
        recipe: Annotated[str, typer.Option("--recipe")] = "full",
        ray_overhead: Annotated[bool, typer.Option(
            "--ray-overhead", help="also measure Ray's own cost: the build's operators, empty (~30 s more)")] = False,
    ) -> None:
        """Build a throwaway store and compare its wall time with one token-encoder pass (floor)."""
        from jobs.local_ray import export_local_ray_env

        export_local_ray_env()
        cfg = get_config(config, set_)
        from jobs.bench.measure import RssSampler, floor_seconds
        from jobs.builder import run_build

        with tempfile.TemporaryDirectory(prefix="memlib-bench-") as tmp:
            store = Path(tmp) / "store"
            with RssSampler() as rss:
                start = time.perf_counter()
                manifest = run_build(cfg, input, format, store, num_cpus=num_cpus, recipe=recipe)
                build_s = time.perf_counter() - start
            floor, n_texts = floor_seconds(store, cfg, num_cpus or os.cpu_count() or 1)
        floor_s = floor["floor_s"]
        turns = manifest["row_counts"]["turns"]
        extra = _overhead(cfg, manifest, num_cpus or os.cpu_count() or 1, floor_s) if ray_overhead else {}
        typer.echo(json.dumps({
            "input": str(input), "recipe": recipe, "embed_backend": cfg.embed.backend, "turns": turns,
            "nodes": manifest["row_counts"]["nodes"], "floor_turns": n_texts, "build_s": round(build_s, 2),
            "floor_s": round(floor_s, 2), **{k: round(v, 2) for k, v in floor.items() if k != "floor_s"},
            "floor_ratio": round(build_s / floor_s, 3) if floor_s else None,
            "turns_per_s": round(turns / build_s, 2), "peak_rss_mb": round(rss.peak / 2**20, 1),
            "sessions": manifest.get("sessions"), "stage_timings_s": manifest["stage_timings_s"], **extra,
        }))


def _overhead(cfg, manifest: dict, cores: int, floor_s: float) -> dict:
    from jobs.bench.ray_overhead import floor_ratio_bound, ray_overhead

    sessions = manifest.get("sessions") or {}
    over = ray_overhead(cfg, cores, int(sessions.get("blocks", 0)), len(manifest.get("tenants", {})),
                        int(manifest["row_counts"]["turns"]))
    work = float(sessions.get("embed_cpu_s", 0.0)) + float(sessions.get("session_local_cpu_s", 0.0))
    return {"ray_overhead": over,
            "floor_ratio_bound": round(floor_ratio_bound(over["graph_cpu_s"], work, cores, floor_s), 3),
            "floor_ratio_bound_minimal": round(floor_ratio_bound(over["minimal_cpu_s"], work, cores, floor_s), 3)}
