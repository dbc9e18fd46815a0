"""Wall-time accounting per stage (seconds, summed over calls)."""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class WallTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            key = getattr(name, "value", name)
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start

    def merge(self, other: dict[str, float]) -> None:
        for k, v in other.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + float(v)

    def rounded(self, digits: int = 3) -> dict[str, float]:
        return {k: round(v, digits) for k, v in self.seconds.items()}
