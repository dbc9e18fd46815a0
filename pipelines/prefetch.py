"""The published builds of the tenants a run in the driver rebuilds, read while it reads its input.

A nightly run that builds in the driver (:mod:`pipelines.inline`) knows the tenants it rebuilds
from the fingerprint pass, before the input's parse pass. Each of their tenant rows starts from
the tenant's published build (:func:`memlib.compose.reuse.load_previous`: 3 s for a 108,000-node
tenant, mostly Lance's own threads), and used to read it only once the input was sharded and
the session pass begun. :class:`PublishedPrefetch` opens the published version and reads those
builds on a thread of its own from the moment the plan is known, in the order the tenant rows
will ask for them, never more than ``ahead`` read and not yet taken (a many-tenant run does not
hold every tenant's build in the driver). The tenant operator takes them
(:func:`take_previous`) and opens the published version through :func:`open_published`; a tenant
not read ahead is read by its row, as before. Once the sessions are planned, it also reads the
rows' sessions kept by earlier runs (:meth:`PublishedPrefetch.read_kept`, taken with
:func:`take_kept`), bounded the same way. On Ray the tenant actors are other processes:
nothing is read ahead for them (a run that turns out too large to build inline closes its prefetch
before Ray starts).
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_ACTIVE: dict[str, PublishedPrefetch] = {}  # store -> the prefetch of the run building it here
_ACTIVE_LOCK = threading.Lock()
_STOP = object()  # PublishedPrefetch._claim: the prefetch was closed


def read_published(store: str | Path) -> tuple[dict, Any]:
    """The store's published manifest ({} for none) and a StoreReader of it with its Lance table
    open (lancedb's import and the first open are 1-2 CPU-s), or None without a published version."""
    manifest, reader = _unopened(store)
    if reader is not None:
        reader.nodes_table()
    return manifest, reader


def _unopened(store: str | Path) -> tuple[dict, Any]:
    """:func:`read_published` before its Lance table is opened (lancedb is not imported)."""
    from memlib.io.store import StoreReader, read_manifest

    manifest = read_manifest(store) or {}
    return manifest, StoreReader(store, manifest) if manifest else None


def open_published(store: str | Path) -> tuple[dict, Any]:
    """:func:`read_published`, or what the prefetch of a run building ``store`` in this process
    opened already (one Lance table open for the run, not one per reader)."""
    with _ACTIVE_LOCK:
        prefetch = _ACTIVE.get(str(store))
    return prefetch.opened.result() if prefetch is not None else read_published(store)


def take_previous(store: str | Path, session_key: str, tenant: str) -> Future | None:
    """The future of ``tenant``'s published build read ahead for a run of ``store`` under
    ``session_key`` (its result or exception: :func:`memlib.compose.reuse.load_previous`'s), or
    None when it was not (then the caller reads it, and the prefetch skips it)."""
    with _ACTIVE_LOCK:
        prefetch = _ACTIVE.get(str(store))
    if prefetch is None or prefetch.session_key != session_key:
        return None
    return prefetch.take(tenant)


def take_kept(store: str | Path, session_key: str, keys: list[str], blocks: list[str]) -> Future | None:
    """The future of :meth:`memlib.compose.session_store.SessionStore.read` of ``keys`` in ``blocks``
    (the kept sessions of a tenant of this run: its result or exception) when it was read ahead
    for a run of ``store`` under ``session_key``; None when it was not (then the caller reads)."""
    with _ACTIVE_LOCK:
        prefetch = _ACTIVE.get(str(store))
    if prefetch is None or prefetch.session_key != session_key:
        return None
    return prefetch.take_kept(keys, blocks)


class PublishedPrefetch:
    """Reads the published builds of ``tenants`` (in that order) of ``store``, at most ``ahead`` of
    them read and not taken; :meth:`start` registers it for the operators of this process,
    :meth:`close` stops it, drops what was not taken and unregisters it."""

    def __init__(self, store: str | Path, session_key: str, tenants: list[str], ahead: int):
        self.store, self.session_key = str(store), session_key
        self.order = list(dict.fromkeys(tenants))
        self.ahead = max(1, ahead)
        self.opened: Future = Future()
        self._ready: dict[str, Future] = {}   # read or being read, not taken yet
        self._taken: set = set()  # tenants and kept reads asked for: read by the prefetch or by the caller
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="memlib-prefetch", daemon=True)
        self._kept: dict[tuple, Future] = {}  # (keys, blocks) -> their kept sessions, read or being read
        self._kept_thread: threading.Thread | None = None

    def start(self) -> PublishedPrefetch:
        with _ACTIVE_LOCK:
            if self.store in _ACTIVE:  # one run builds a store at a time (the store's lock)
                raise RuntimeError(f"a prefetch of {self.store} is already running")
            _ACTIVE[self.store] = self
        self._thread.start()
        return self

    def take(self, tenant: str) -> Future | None:
        """``tenant``'s build when it was read (or is being read) ahead; None otherwise, and it
        will not be."""
        with self._cond:
            self._taken.add(tenant)
            future = self._ready.pop(tenant, None)
            self._cond.notify_all()
        return future

    def read_kept(self, wanted: list[tuple[list[str], list[str]]], dim: int) -> None:
        """Read the kept sessions ``wanted`` ((session keys, blocks holding them) per tenant, in the
        order the rows ask for them) on a second thread, as the rows would, at most ``ahead`` read
        and not taken: once the sessions are planned, a row finds its tenant's kept sessions read
        (or being read) and waits only for this run's blocks."""
        if wanted and self._kept_thread is None and not self._closed:
            first = threading.Event()  # the first tenant's read is registered before a row can ask for it
            self._kept_thread = threading.Thread(target=self._run_kept, args=(wanted, dim, first),
                                                 name="memlib-prefetch-kept", daemon=True)
            self._kept_thread.start()
            first.wait()

    def take_kept(self, keys: list[str], blocks: list[str]) -> Future | None:
        """The read of exactly ``keys`` in ``blocks`` when it was read (or is being read) ahead;
        None otherwise, and it will not be."""
        key = (tuple(keys), tuple(blocks))
        with self._cond:
            self._taken.add(key)
            future = self._kept.pop(key, None)
            self._cond.notify_all()
        return future

    def close(self) -> None:
        """Stop reading, wait for the reads in progress, drop the builds and sessions not taken."""
        with self._cond:
            self._closed = True
            self._ready.clear()
            self._kept.clear()
            self._cond.notify_all()
        with _ACTIVE_LOCK:
            if _ACTIVE.get(self.store) is self:
                del _ACTIVE[self.store]
        for thread in (self._thread, self._kept_thread):
            if thread is not None and thread.is_alive():
                thread.join()
        self._ready.clear()
        self._kept.clear()

    def _run_kept(self, wanted: list[tuple[list[str], list[str]]], dim: int, first: threading.Event) -> None:
        try:
            from memlib.compose.session_store import SessionStore

            sessions = SessionStore(self.store, self.session_key, dim, trust_unchanged=True)
            for keys, blocks in wanted:
                future = self._claim((tuple(keys), tuple(blocks)), self._kept)
                if future is _STOP:
                    return
                first.set()
                if future is not None:  # raised again in the row that asks for it
                    _settle(future, lambda k=keys, b=blocks: sessions.read(k, b))
        finally:
            first.set()

    def _claim(self, key: Any, pending: dict) -> Any:
        """Wait until fewer than ``ahead`` reads in ``pending`` are not taken, then register a read
        of ``key`` there: its future; None when a row asked for ``key`` already (it reads it);
        ``_STOP`` once closed."""
        with self._cond:
            while not self._closed and len(pending) >= self.ahead:
                self._cond.wait()
            if self._closed:
                return _STOP
            if key in self._taken:
                return None
            future: Future = Future()
            future.set_running_or_notify_cancel()
            pending[key] = future
            return future

    def _run(self) -> None:
        from memlib.compose.published_parts import read_parts
        from memlib.compose.reuse import load_previous

        # the first tenant's part files are read (pyarrow, mostly without the GIL) while lancedb is
        # imported and its table opened: its row waits for both
        with ThreadPoolExecutor(1, thread_name_prefix="memlib-prefetch-parts") as pool:
            try:
                manifest, reader = _unopened(self.store)
                first = self._first(manifest)
                early = pool.submit(read_parts, reader, first) if reader is not None and first else None
                if reader is not None:
                    reader.nodes_table()
            except BaseException as exc:  # noqa: BLE001 - met again, and reported, by the tenant operator
                self.opened.set_exception(exc)
                return
            self.opened.set_result((manifest, reader))
            if reader is None:
                return
            for tenant in self.order:
                future = self._claim(tenant, self._ready)
                if future is _STOP:
                    return
                parts = early if tenant == first else None
                if future is not None:  # a failure: the tenant's row reports it (reuse_failure)
                    _settle(future, lambda t=tenant, p=parts: load_previous(self.store, t, self.session_key, manifest,
                                                                            reader=reader, parts=p))

    def _first(self, manifest: dict) -> str | None:
        """The first tenant to read when the published build is one it can reuse (else None)."""
        from memlib.compose.published_parts import reusable

        first = self.order[0] if self.order else None
        return first if reusable(manifest, first, self.session_key) else None


def _settle(future: Future, read: Callable[[], Any]) -> None:
    """``future`` given what ``read`` returns, or the exception it raises."""
    try:
        future.set_result(read())
    except Exception as exc:  # noqa: BLE001 - raised again where the future is taken
        future.set_exception(exc)


# the interpreter's switch interval while the driver shards the input of a run in the driver: the
# parse holds the GIL in long Python stretches, and the prefetch thread (and the warm-up's) needs
# it for short ones between Lance's native calls, each time for up to the interval (5 ms by default).
# At 0.5 ms the tenant stages of the 2,500-session nightly began 0.3-0.4 s earlier (decision 0046)
HANDOFF_S = 0.0005


@contextmanager
def quick_handoff(interval: float = HANDOFF_S) -> Iterator[None]:
    """The GIL handed over every ``interval`` seconds within, then the interval it was."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, interval))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def prefetch_order(tenants: list[str], published: dict[str, Any], batch_turns: int) -> list[str]:
    """``tenants`` in about the order their rows run (:func:`pipelines.tenant_op.pack_tenants`: a
    tenant of ``batch_turns`` turns or more alone, largest first, then the others), by the turns
    of their published builds; tenants not published are left out (nothing to read)."""
    turns = {t: int(published[t].get("turns", 0) or 0) for t in tenants if t in published}
    large = sorted((t for t, n in turns.items() if n >= batch_turns), key=lambda t: (-turns[t], t))
    return large + sorted(t for t, n in turns.items() if n < batch_turns)
