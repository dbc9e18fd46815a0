"""Background polling of a store's manifest: picks up a newly published version."""
from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger("memlib.serve")


class VersionPoller:
    """Calls ``check()`` every ``interval_s`` seconds on a daemon thread until stopped."""

    def __init__(self, check: Callable[[], object], interval_s: float):
        self.check = check
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "VersionPoller":
        if self.interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="memlib-version-poller", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # a bad manifest must not kill polling; the next tick retries
                log.exception("store version check failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
