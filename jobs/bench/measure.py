"""Measuring a build from its driver: the peak RSS of the driver and every process it started
(Ray's GCS, raylet and workers), and the floor a build is compared with (one pass of the
default token encoder over a store's turn texts), and a build's wall time in a child process.
Used by ``memlib bench build``, ``bench
nightly`` and ``bench scale``, which only parse and print."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import psutil


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


def floor_seconds(store: Path, cfg, cores: int) -> tuple[dict[str, float], int]:
    """One pass of the default token encoder over the store's turn texts, here (jobs.bench.embed_floor)."""
    import pyarrow.compute as pc

    from jobs.bench.embed_floor import encoder_floor
    from memlib.io.store import StoreReader

    nodes = StoreReader(store).nodes(columns=["kind", "text"])
    texts = nodes.filter(pc.equal(nodes.column("kind"), "turn")).column("text").to_pylist()
    return encoder_floor(texts, cores, model_cache=cfg.embed.model_cache), len(texts)


def build_args(corpus: Path, store: Path, fmt: str = "jsonl", config: Optional[Path] = None,
               sets: Optional[list[str]] = None, extra: tuple[str, ...] = ()) -> list[str]:
    """The arguments of ``memlib build`` for ``corpus`` into ``store``."""
    return ["--input", str(corpus), "--format", fmt, "--out", str(store), *extra,
            *(["--config", str(config)] if config else []), *[a for item in sets or [] for a in ("--set", item)]]


def timed_build(corpus: Path, store: Path, num_cpus: Optional[int], cores: set[int] | None, log: Path,
                config: Optional[Path] = None, sets: Optional[list[str]] = None, fmt: str = "jsonl",
                extra: tuple[str, ...] = ()) -> float:
    """Wall seconds of ``memlib build`` in a child process (its own local Ray); ``cores``: the CPU
    cores the child and every process it starts may run on (Linux affinity, inherited)."""
    cmd = [sys.executable, "-m", "jobs.cli", "build", *build_args(corpus, store, fmt, config, sets, extra)]
    cmd += ["--num-cpus", str(num_cpus)] if num_cpus else []
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    start = time.perf_counter()
    with log.open("w") as out:
        subprocess.run(cmd, check=True, env=env, preexec_fn=pin, stdout=out, stderr=subprocess.STDOUT)
    return time.perf_counter() - start
