"""Request and token rate limits (per minute), as reservations.

A limiter hands out start times: ``reserve(tokens)`` books the next slot that respects both
the requests-per-minute and the tokens-per-minute budget and returns how many seconds the
caller must wait before sending. Because it only returns a number, one limiter can live in a
single process shared by many workers (``pipelines/llm_actors.py`` wraps it in a Ray actor)
while each worker sleeps on its own side.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class RateLimiter(Protocol):
    def reserve(self, tokens: int) -> float:
        """Book one request of ``tokens`` tokens; seconds to wait before sending it."""
        ...


class LocalRateLimiter:
    """Spacing limiter: requests are at least ``60/rpm`` s apart and a request of ``n``
    tokens pushes the token clock by ``60*n/tpm`` s. Thread-safe."""

    def __init__(self, requests_per_minute: float, tokens_per_minute: float, *,
                 clock: Callable[[], float] = time.monotonic):
        if requests_per_minute <= 0 or tokens_per_minute <= 0:
            raise ValueError("rate limits must be positive")
        self.req_interval = 60.0 / requests_per_minute
        self.tok_interval = 60.0 / tokens_per_minute
        self._clock = clock
        self._next_req = 0.0
        self._next_tok = 0.0
        self._lock = threading.Lock()

    def reserve(self, tokens: int) -> float:
        with self._lock:
            now = self._clock()
            start = max(now, self._next_req, self._next_tok)
            self._next_req = start + self.req_interval
            self._next_tok = start + max(0, tokens) * self.tok_interval
            return start - now


class NoLimit:
    def reserve(self, tokens: int) -> float:
        return 0.0
