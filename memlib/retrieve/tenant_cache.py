"""A replica's cache of opened tenants (:class:`TenantCache`): least recently used out first,
bounded by the bytes its tenant views hold (:attr:`~memlib.retrieve.tenant.TenantIndex.nbytes`),
kept across a publish for the tenants no version in between rebuilt
(docs/decisions/0027-serving-cache.md)."""
from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from memlib.io.store import StoreReader, read_manifest
from memlib.retrieve.tenant import QueryEmbedder, TenantIndex

log = logging.getLogger("memlib.serve")


def default_cache_bytes(share: float = 0.25) -> int:
    """``share`` of the memory this process may use: its cgroup's limit when it has one (a
    container), else the machine's RAM."""
    limit = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            limit = int(text)
            break
    if limit is None:
        import os

        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(limit * share)


@dataclass
class CacheStats:
    """What a :class:`TenantCache` did since it was made (the service exports them)."""
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    kept_on_refresh: int = 0     # loaded tenants a new version did not change, kept loaded
    dropped_on_refresh: int = 0  # loaded tenants a new version rebuilt or removed
    load_s: list[float] = field(default_factory=list)  # seconds each miss took to open its tenant (last 1,000)


@dataclass
class TenantCache:
    """LRU of :class:`TenantIndex` objects for one published version of a store, bounded by
    bytes (``max_bytes``: what the loaded tenants hold, :attr:`TenantIndex.nbytes`) and, when
    given, by a number of tenants.

    ``get`` is thread-safe. ``refresh`` switches to a newly published version: a loaded tenant
    that no version in between rebuilt (each carried it, or failed and kept it) stays loaded,
    over the new version; the others are dropped."""

    store: Path
    embedder: QueryEmbedder | None = None
    max_tenants: int | None = None
    max_bytes: int | None = None
    _reader: StoreReader | None = field(default=None, repr=False)
    _items: "OrderedDict[str, TenantIndex]" = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _loading: dict[str, threading.Lock] = field(default_factory=dict, repr=False)  # tenant -> its opening
    _sizes: dict[str, int] = field(default_factory=dict, repr=False)  # loaded tenant -> bytes when last asked
    _total: int = field(default=0, repr=False)  # the sum of _sizes
    _manifest_sig: tuple | None = field(default=None, repr=False)  # manifest.json's (inode, mtime, size) read last
    stats: CacheStats = field(default_factory=CacheStats, repr=False)
    on_load: Callable[[str, float], None] | None = field(default=None, repr=False)  # (tenant, seconds) per miss

    def __post_init__(self) -> None:
        self.store = Path(self.store)

    @property
    def reader(self) -> StoreReader:
        if self._reader is None:
            self._reader = StoreReader(self.store)
        return self._reader

    @property
    def version(self) -> str:
        return self.reader.version

    def tenants(self) -> list[str]:
        return self.reader.tenants()

    def has_tenant(self, tenant: str) -> bool:
        """Whether the version served holds ``tenant`` (no sorting of its tenants, as tenants() does)."""
        return self.reader.has_tenant(tenant)

    def _signature(self) -> tuple | None:
        try:
            st = (self.store / "manifest.json").stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def may_have_changed(self, sig: tuple | None = None) -> bool:
        """Whether ``manifest.json`` may name another version than the one served: False only when
        it is the very file last read (a publish swaps in a new file; parsing a 10,000-tenant
        manifest on every poll took 5 % of a loaded replica's CPU)."""
        sig = self._signature() if sig is None else sig
        return sig is None or sig != self._manifest_sig or self._reader is None

    def refresh(self, embedder: QueryEmbedder | None = None) -> bool:
        """Switch to the currently published version; True when it changed. ``embedder``: the
        query embedder of that version, swapped in with it (a version built in another vector
        space: then no loaded tenant is kept)."""
        sig = self._signature()
        if not self.may_have_changed(sig):
            return False
        manifest = read_manifest(self.store)
        self._manifest_sig = sig
        if manifest is None or (self._reader is not None and manifest["version"] == self._reader.version):
            return False
        old = self._reader
        loaded = list(self._items)
        keep = (unchanged_tenants(self.store, old.manifest, manifest, loaded)
                if old is not None and embedder is None and loaded else set())
        with self._lock:
            self._reader = StoreReader(self.store, manifest)
            if embedder is not None:
                self.embedder = embedder
            items: OrderedDict[str, TenantIndex] = OrderedDict()
            for tenant, idx in self._items.items():  # least recently used first, as before
                if tenant in keep:
                    items[tenant] = idx.rebound(self._reader)
            self.stats.kept_on_refresh += len(items)
            self.stats.dropped_on_refresh += len(self._items) - len(items)
            self._items = items
            self._sizes = {t: self._sizes.get(t, 0) for t in items}
            self._total = sum(self._sizes.values())
        return True

    def get(self, tenant: str) -> TenantIndex:
        """The tenant's view: a hit under the lock, a miss opened outside it (requests for loaded
        tenants never wait for another tenant's load; concurrent misses of one tenant open it once)."""
        with self._lock:
            idx = self._hit(tenant)
            if idx is not None:
                return idx
            reader = self.reader
            loading = self._loading.setdefault(tenant, threading.Lock())
        with loading:
            with self._lock:
                idx = self._hit(tenant)
                if idx is not None:
                    return idx
            try:
                idx = TenantIndex(reader, tenant, self.embedder)
            finally:
                with self._lock:
                    self._loading.pop(tenant, None)
            with self._lock:
                self.stats.misses += 1
                self.stats.load_s = self.stats.load_s[-999:] + [idx.load_s]
                if reader is self._reader:  # not a version replaced while it opened
                    self._items[tenant] = idx
                    self._sizes[tenant] = idx.nbytes
                    self._total += self._sizes[tenant]
                    self._trim(keep=tenant)
        if self.on_load is not None:
            self.on_load(tenant, idx.load_s)
        return idx

    def _hit(self, tenant: str) -> TenantIndex | None:
        """(Under the lock.) A loaded tenant, now the most recently used, its size brought up to
        date (what its strategies memoized since it was last asked)."""
        idx = self._items.get(tenant)
        if idx is None:
            return None
        self._items.move_to_end(tenant)
        self.stats.hits += 1
        size = idx.nbytes
        self._total += size - self._sizes.get(tenant, 0)
        self._sizes[tenant] = size
        self._trim(keep=tenant)
        return idx

    def _trim(self, keep: str) -> None:
        """Evict least recently used tenants (never ``keep``, the one just asked for) while the
        cache holds more than its bounds (each tenant's size as of when it was last asked:
        strategies memoize as they run)."""
        while self._items and next(iter(self._items)) != keep and (
                (self.max_tenants is not None and len(self._items) > self.max_tenants)
                or (self.max_bytes is not None and self._total > self.max_bytes and len(self._items) > 1)):
            gone, _ = self._items.popitem(last=False)
            self._total -= self._sizes.pop(gone, 0)
            self.stats.evictions += 1

    @property
    def nbytes(self) -> int:
        """Bytes of the loaded tenants (as of now)."""
        with self._lock:
            return sum(i.nbytes for i in self._items.values())

    def loaded(self) -> list[str]:
        """The loaded tenants, least recently used first."""
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, tenant: object) -> bool:
        """Whether ``tenant`` is loaded (a snapshot: another thread may be loading or evicting it)."""
        return tenant in self._items


def unchanged_tenants(store: Path, old: dict[str, Any], new: dict[str, Any], tenants: Iterable[str]) -> set[str]:
    """Those of ``tenants`` whose published data is the same in manifest ``new`` as in ``old``:
    following each version's ``base_version`` back from ``new`` reaches ``old``, and every
    version on the way carried the tenant (or failed and kept it). Anything else (a rollback, a
    version without its link, a manifest missing or unreadable) keeps none."""
    wanted, target = set(tenants), old.get("version")
    same = {"carried", "failed"}
    manifest, hops = new, 0
    while wanted and manifest.get("version") != target:
        entries = manifest.get("tenants", {})
        wanted = {t for t in wanted if (entries.get(t) or {}).get("status") in same}
        base = manifest.get("base_version")
        hops += 1
        if not base or hops > 1_000:
            return set()
        try:
            manifest = json.loads((Path(store) / "manifests" / f"{base}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.info("keeping no loaded tenant across the publish: manifest %s unreadable (%s)", base, exc)
            return set()
    return wanted if manifest.get("version") == target else set()
