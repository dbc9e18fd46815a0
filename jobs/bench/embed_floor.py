"""The embedding floor: the fastest single pass of ``auto``'s token encoder over a set of texts
on this machine, every core busy. ``memlib bench build`` divides the build's wall time by it.

Two ways of using the cores are timed, after model load and warm-up, and the faster one is
the floor (so the ratio is never flattered by a slow floor):

- ``threads``: one process, one onnxruntime session with an intra-op thread per core, texts
  in batches of 32 in length order (little padding);
- ``processes``: one process per core, one thread each, every text encoded on its own (a
  batch of one: no padding; what the build's embed operator does), texts dealt out by length
  so the processes finish together.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

_WORKER: dict[str, object] = {}


def _batches_in_length_order(encoder, texts: Sequence[str], size: int = 32) -> None:
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    for start in range(0, len(order), size):
        encoder.encode([texts[i] for i in order[start:start + size]])


def _init(model: str, model_cache: str | None) -> None:
    from memlib.embed import token_encoder

    enc = token_encoder.TokenEncoder(1, model=model, model_cache=model_cache)
    enc.encode(["warm up the encoder", "and its kernels"])
    _WORKER["encoder"] = enc


def _encode_each(texts: list[str]) -> float:
    enc = _WORKER["encoder"]
    start = time.perf_counter()
    for text in texts:
        enc.encode([text])  # type: ignore[attr-defined]
    return time.perf_counter() - start


def _ready(_: int) -> bool:
    time.sleep(0.5)  # hold this worker, so each of the first ``cores`` tasks starts its own process
    return "encoder" in _WORKER


def threads_pass(texts: Sequence[str], cores: int, model: str, model_cache: str | Path | None) -> float:
    from memlib.embed import token_encoder

    enc = token_encoder.TokenEncoder(cores, model=model, model_cache=model_cache)
    enc.encode(list(texts[:8]) or ["warm up"])
    start = time.perf_counter()
    _batches_in_length_order(enc, texts)
    return time.perf_counter() - start


def processes_pass(texts: Sequence[str], cores: int, model: str, model_cache: str | Path | None) -> float:
    """Wall time of ``cores`` one-thread processes encoding their share of ``texts`` one by one."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    shares: list[list[str]] = [[] for _ in range(cores)]
    for rank, i in enumerate(order):  # longest first, dealt round robin: balanced shares
        shares[rank % cores].append(texts[i])
    cache = None if model_cache is None else str(model_cache)
    with ProcessPoolExecutor(cores, mp_context=mp.get_context("spawn"), initializer=_init,
                             initargs=(model, cache)) as pool:
        assert all(pool.map(_ready, range(cores)))  # every worker loaded and warm
        start = time.perf_counter()
        list(pool.map(_encode_each, shares))
        return time.perf_counter() - start


def encoder_floor(texts: Sequence[str], cores: int, model: str | None = None,
                  model_cache: str | Path | None = None) -> dict[str, float]:
    """``{"floor_s", "floor_threads_s", "floor_processes_s"}`` for one pass over ``texts``."""
    from memlib.embed import token_model

    model = model or token_model.DEFAULT_MODEL
    cores = max(1, cores)
    t = threads_pass(texts, cores, model, model_cache)
    p = processes_pass(texts, cores, model, model_cache)
    return {"floor_s": min(t, p), "floor_threads_s": t, "floor_processes_s": p}
