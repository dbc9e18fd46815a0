"""One writer per store: every run that writes a store (build, nightly, compact, rollback) holds an
exclusive lock on ``STORE/.memlib.lock`` for its whole duration. A second one started meanwhile
stops at once with a one-line error instead of clearing or interleaving the first one's
unpublished version (readers, the service among them, never take the lock)."""
from __future__ import annotations

import fcntl
import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from memlib.io.store import StoreError

LOCK_FILE = ".memlib.lock"
F = TypeVar("F", bound=Callable[..., Any])


class StoreBusy(StoreError):
    """Another process is writing the store."""


@contextmanager
def store_lock(store: str | Path) -> Iterator[None]:
    path = Path(store)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a read-only file system, a directory of another user, a file in the way
        raise StoreError(f"{path}: cannot write the store ({exc.strerror or exc}: {exc.filename}); "
                         "give a directory this user can write") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            raise StoreBusy(f"{path}: another memlib process (pid {holder}) is writing this store; "
                            "wait for it to finish") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def locked(arg: str) -> Callable[[F], F]:
    """Decorator: run the function holding the lock of the store passed as ``arg`` (name of a
    positional-or-keyword parameter)."""
    def wrap(fn: F) -> F:
        import inspect

        params = list(inspect.signature(fn).parameters)
        index = params.index(arg)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            store = kwargs[arg] if arg in kwargs else args[index]
            with store_lock(store):
                return fn(*args, **kwargs)
        return run  # type: ignore[return-value]
    return wrap
