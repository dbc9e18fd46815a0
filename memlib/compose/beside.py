"""Tenant steps that run beside the others on a side thread (``memlib-beside``).

:func:`memlib.compose.reference.tenant_steps` runs a tenant's steps one after another on one
thread, which holds the GIL for a third of its time or less (numpy, Arrow and polars release
it). A step whose inputs the steps after it do not change, and whose output they do not read
until some later point, runs on a side thread from where it would have started; the tenant
thread applies its result at that later point (:meth:`BesideSteps.join`), in the order the steps
were started, so the state gets the same rows in the same order whichever thread finishes first.

A side step only computes: it reads the state and returns a value, and its ``apply`` (run on the
tenant thread at the join) writes the state. Its error is raised at the join, or instead of a
later step's error when that step fails first: the tenant fails with the error it would have
failed with had the steps run in sequence (:meth:`BesideSteps.raise_first`).
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

THREAD_PREFIX = "memlib-beside"
WAIT = "beside_wait"  # the timings' key of the tenant thread's wait for its side steps


@dataclass
class _Started:
    future: Future
    apply: Callable[[Any], None]
    name: str


def _timed(fn: Callable[..., Any], args: tuple) -> tuple[Any, float]:
    start = time.perf_counter()
    return fn(*args), time.perf_counter() - start


class BesideSteps:
    """One tenant's side steps: one side thread, made at the first :meth:`start`, whose steps run
    in the order they were started; :meth:`close` ends it (the tenant's steps end with it)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._started: list[_Started] = []
        self._held: list[tuple[str, Callable[..., Any], tuple, Callable[[Any], None]]] = []
        # each applied side step's own wall time by name, and the tenant thread's wait at the joins
        self.seconds: dict[str, float] = {}

    def start(self, name: str, fn: Callable[..., Any], *args: Any, apply: Callable[[Any], None]) -> None:
        """Run ``fn(*args)`` on the side thread; ``apply(result)`` runs at the next :meth:`join`."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=THREAD_PREFIX)
        self._started.append(_Started(self._pool.submit(_timed, fn, args), apply, name))

    def hold(self, name: str, fn: Callable[..., Any], *args: Any, apply: Callable[[Any], None]) -> None:
        """:meth:`start` it at the next :meth:`release` (or :meth:`join`): for a step whose inputs
        are ready but that would slow the steps before that point more than it saves."""
        self._held.append((name, fn, args, apply))

    def release(self) -> None:
        held, self._held = self._held, []
        for name, fn, args, apply in held:
            self.start(name, fn, *args, apply=apply)

    def join(self, upto: str | None = None) -> None:
        """Wait for every started step (``upto``: those up to the last one of that name; none when
        no step of that name is pending) and apply their results, in the order they were started
        (a step's error is raised here, and the steps started after it are not applied)."""
        if upto is None or any(held[0] == upto for held in self._held):
            self.release()
        names = [step.name for step in self._started]
        count = len(names) if upto is None else len(names) - names[::-1].index(upto) if upto in names else 0
        for _ in range(count):
            step = self._started[0]
            waited = time.perf_counter()
            result, seconds = step.future.result()  # a failed step stays first for raise_first
            self._add(WAIT, time.perf_counter() - waited)
            self._started.pop(0)
            self._add(step.name, seconds)
            step.apply(result)

    def _add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def raise_first(self) -> None:
        """After a tenant-thread step failed: wait for the side steps started before it and raise the
        first one's error, if one failed (it would have failed the tenant first); else return."""
        started, self._started = self._started, []
        for step in started:
            error = step.future.exception()
            if error is not None:
                raise error from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
