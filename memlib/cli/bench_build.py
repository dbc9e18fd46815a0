"""``memlib bench build``: build cost against the embedder alone on the same node texts.

Prints one JSON line: build_s (the whole `memlib build` job: read, Ray stages, graph,
Lance write, indexes, publish), embed_only_s (every distinct node text of the built store
through the same embedder in this process, same run), overhead_ratio = build_s /
embed_only_s, turns_per_s, and peak_rss_mb (driver plus every child process: Ray's GCS,
raylet and workers, sampled every 0.25 s).
"""
from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Optional

import psutil
import typer

from memlib.cli.common import ConfigOpt, SetOpt, get_config
from memlib.config import export_local_ray_env


class RssSampler:
    """Peak of the summed RSS of this process and all its descendants."""

    def __init__(self, interval_s: float = 0.25):
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        me = psutil.Process()
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


def embed_only_seconds(store: Path, cfg) -> tuple[float, int]:
    """Seconds to embed the store's distinct node texts once, batched, in this process."""
    from memlib.embed import get_embedder
    from memlib.io.store import StoreReader

    texts = StoreReader(store).nodes(columns=["text"]).column("text").unique().to_pylist()
    embedder = get_embedder(cfg.embed)
    embedder.embed_passages(texts[:8])  # model load and warm-up are not embedding work
    start = time.perf_counter()
    embedder.embed_passages(texts)
    return time.perf_counter() - start, len(texts)


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("build")
    def bench_build(
        input: Annotated[Path, typer.Option("--input", "-i")] = Path("../shared/data/locomo_dev3.json"),
        format: Annotated[str, typer.Option("--format", "-f")] = "locomo",
        config: ConfigOpt = None,
        set_: SetOpt = None,
        num_cpus: Annotated[Optional[int], typer.Option("--num-cpus")] = None,
        recipe: Annotated[str, typer.Option("--recipe")] = "full",
    ) -> None:
        """Build a throwaway store and compare its wall time with embedding alone."""
        export_local_ray_env()
        cfg = get_config(config, set_)
        from jobs.build import run_build

        with tempfile.TemporaryDirectory(prefix="memlib-bench-") as tmp:
            store = Path(tmp) / "store"
            with RssSampler() as rss:
                start = time.perf_counter()
                manifest = run_build(cfg, input, format, store, num_cpus=num_cpus, recipe=recipe)
                build_s = time.perf_counter() - start
            embed_s, n_texts = embed_only_seconds(store, cfg)
        turns = manifest["row_counts"]["turns"]
        typer.echo(json.dumps({
            "input": str(input), "recipe": recipe, "turns": turns, "nodes": manifest["row_counts"]["nodes"],
            "distinct_texts": n_texts, "build_s": round(build_s, 2), "embed_only_s": round(embed_s, 2),
            "overhead_ratio": round(build_s / embed_s, 3) if embed_s else None,
            "turns_per_s": round(turns / build_s, 2), "peak_rss_mb": round(rss.peak / 2**20, 1),
            "stage_timings_s": manifest["stage_timings_s"],
        }))
