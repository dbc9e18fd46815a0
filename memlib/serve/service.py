"""The retrieval service, independent of any web framework and of Ray.

One :class:`SearchService` per replica: it owns a :class:`TenantCache` (graphs and tables
loaded once per tenant, shared by all requests), one instance per strategy, the
authorizer and the metrics. Every answer is computed from one :class:`TenantIndex`, which
pins the store version it was loaded from, so a publish during a request never mixes
versions; :meth:`refresh` (poller or ``POST /v1/reload``) swaps the cache to the new one.
"""
from __future__ import annotations

import gc
import logging
import re
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from memlib.config import MemlibConfig
from memlib.embed.space import built_space
from memlib.io.checksums import DamagedFileError
from memlib.io.files import atomic_write
from memlib.io.store import read_manifest
from memlib.retrieve.base import Strategy
from memlib.retrieve.kernels import run_search
from memlib.retrieve.registry import get_strategy, list_strategies
from memlib.retrieve.tenant import QueryEmbedder, TenantIndex
from memlib.retrieve.tenant_cache import TenantCache, default_cache_bytes
from memlib.serve.auth import Authorizer, Principal
from memlib.serve.errors import ApiError, ErrorCode
from memlib.serve.explore import node_graph, session_view
from memlib.serve.file_checks import (
    FILES_UNREADABLE,
    GRAPH_UNREADABLE,
    PARTIAL,
    check_in_slices,
    graph_only,
    usable_damage,
)
from memlib.serve.metrics import ServiceMetrics
from memlib.serve.models import (
    HealthResponse,
    NodeGraphResponse,
    ReloadResponse,
    SearchRequest,
    SearchResponse,
    SessionResponse,
    TenantsResponse,
    search_response,
)
from memlib.serve.poller import VersionPoller
from memlib.serve.requests import Limits, check_tenant_id, parse_search, question_time, validate_search

log = logging.getLogger("memlib.serve")
HOT_TENANTS_MAX = 1_000_000  # lines of serve.hot_tenants_file


def load_embedder(cfg: MemlibConfig, manifest: dict | None = None, store: str = "the store") -> QueryEmbedder:
    """The query embedder for a store version: the model its nodes were embedded with
    (:func:`memlib.embed.space.store_embed_config`), run with ``cfg``'s runtime settings."""
    from memlib.embed import get_embedder
    from memlib.embed.space import store_embed_config

    return get_embedder(store_embed_config(cfg.embed, manifest, store))


_ABS_PATH = re.compile(r"(?<![\w.~-])(?:/|[A-Za-z]:\\)[^\s'\"(),;]+")


def without_paths(reason: str, store: str | Path) -> str:
    """``reason`` with the store's location written ``STORE`` and any other absolute path ``<path>``."""
    for root in dict.fromkeys((str(Path(store).resolve()), str(store))):
        reason = reason.replace(root, "STORE")
    return _ABS_PATH.sub("<path>", reason)


class SearchService:
    def __init__(self, store: str | Path, cfg: MemlibConfig, embedder: QueryEmbedder | None = None):
        self.cfg = cfg
        self.auth = Authorizer.from_config(cfg.serve)
        manifest = read_manifest(store)
        self.space = built_space(manifest)  # the vector space the loaded embedder serves
        self.own_embedder = embedder is None
        if embedder is None:
            embedder = load_embedder(cfg, manifest, str(store))
        self.metrics = ServiceMetrics()
        self.cache = TenantCache(Path(store), embedder=embedder, max_tenants=cfg.serve.cache_tenants,
                                 max_bytes=cfg.serve.cache_bytes or default_cache_bytes(),
                                 on_load=lambda _tenant, seconds: self.metrics.tenant_load.observe(seconds))
        self.metrics.watch_cache(self.cache)
        self.asked: Counter[str] = Counter()  # searches per tenant (serve.hot_tenants_file)
        self.strategy_names = list_strategies()
        self.limits = Limits(max_body_bytes=cfg.serve.max_body_bytes, max_k=cfg.serve.max_k,
                             default_k=min(cfg.retrieve.k, cfg.serve.max_k),
                             default_strategy=cfg.retrieve.default_strategy,
                             body_timeout_s=cfg.serve.body_timeout_s)
        self.metrics.set_version(self.cache.version)
        self._strategies: dict[str, Strategy] = {}
        self.broken: dict[str, str] = {}  # tenant -> why it cannot be served (this store version)
        self._lock = threading.Lock()
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix="memlib-ahead")  # see search
        self.poller = VersionPoller(self.refresh, cfg.serve.poll_interval_s)
        self._stopped = threading.Event()  # ends the background check
        self.checked_version: str | None = None  # the version the background check went through

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, freeze_gc: bool = False) -> "SearchService":
        """Load the tenants of ``serve.hot_tenants_file`` (most asked first, while they fit in the
        cache), then the first ``serve.preload_tenants`` tenants (and their graphs); warm the
        embedder and every strategy on a healthy one; start polling. A tenant that cannot be
        loaded is recorded as broken (503 for it, ``/healthz`` degraded); the others are served.
        ``freeze_gc`` (a replica: the process is the service's): move everything made so far out
        of the garbage collector's sight (``gc.freeze``; :meth:`stop` gives it back)."""
        self._preload_hot()
        healthy = []
        for tenant in self.cache.tenants()[:self.cfg.serve.preload_tenants]:
            try:
                idx = self.index(tenant)
            except ApiError:
                continue
            if self._graph_error(tenant, idx) is None:
                healthy.append(tenant)
        if healthy:
            self._warm(healthy[0])
        self.metrics.cached.set(len(self.cache))
        if freeze_gc:
            # what start-up made (libraries, models, preloaded tenants) lives as long as the replica:
            # out of the garbage collector's sight, a full collection scans only what came after
            # (they scanned a few hundred thousand objects, 10-30 ms inside some cold tenant's query)
            gc.collect()
            gc.freeze()
            self._frozen = True
        self.poller.start()
        self._check_kept()
        return self

    def _check_kept(self) -> None:
        """Check the served version's files tenant by tenant on a thread (memlib/serve/file_checks.py)."""
        check_in_slices(self, self.cache.reader)

    def _broken(self, tenant: str, what: str, exc: BaseException) -> str:
        reason = f"{what}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        if self.broken.get(tenant) != reason:
            log.error("tenant %s of store version %s is broken: %s", tenant, self.cache.version, reason)
        self.broken[tenant] = reason
        return reason

    def _graph_error(self, tenant: str, idx: TenantIndex) -> str | None:
        """Why the tenant's graph cannot be loaded (``None``: it loads, or the tenant has none)."""
        known = self.broken.get(tenant, "")
        if known.startswith(GRAPH_UNREADABLE):
            return known
        try:
            if idx.has_graph:
                idx.graph  # noqa: B018 - loads and keeps the graph
        except Exception as exc:  # noqa: BLE001 - graph-tool raises C++ errors of many types
            return self._broken(tenant, "graph file unreadable", exc)
        return None

    def _warm(self, tenant: str) -> None:
        idx = self.cache.get(tenant)
        for name in self.strategy_names:
            try:
                # a relative date: ``auto`` resolves it with dateparser, whose first parse loads its
                # language data (seconds), here rather than in a client's query
                run_search(idx, self.strategy(name), "warm up query of last week", 1)
            except Exception as exc:  # noqa: BLE001 - a broken strategy is reported per request, not at start
                log.warning("warm-up of strategy %s failed: %s", name, exc)

    def _preload_hot(self) -> None:
        path = self.cfg.serve.hot_tenants_file
        if not path or not Path(path).is_file():
            return
        known = set(self.cache.tenants())
        try:
            hot = [t for t in dict.fromkeys(Path(path).read_text(encoding="utf-8").split()) if t in known]
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("serve.hot_tenants_file %s unreadable, nothing preloaded from it: %s", path, exc)
            return
        budget = self.cache.max_bytes
        for tenant in hot:
            evicted = self.cache.stats.evictions
            try:
                self.index(tenant)
            except ApiError:
                continue
            if self.cache.stats.evictions > evicted or (budget is not None and self.cache.nbytes >= 0.9 * budget):
                break  # full: the rest would push out the most asked
        log.info("preloaded %d tenant(s) of %s (%d bytes)", len(self.cache), path, self.cache.nbytes)

    def stop(self) -> None:
        self._stopped.set()
        self.poller.stop()
        self._ahead.shutdown(wait=False)
        self.save_hot_tenants()
        if getattr(self, "_frozen", False):
            gc.unfreeze()  # collectable again (at the latest when the process ends)
            self._frozen = False

    def save_hot_tenants(self) -> None:
        """Write ``serve.hot_tenants_file``: this replica's tenants by searches, most asked first, then
        those the file named before that it was not asked for (the next replica preloads them)."""
        path = self.cfg.serve.hot_tenants_file
        if not path:
            return
        with self._lock:
            asked = [t for t, _ in self.asked.most_common()]
        try:
            before = Path(path).read_text(encoding="utf-8").split() if Path(path).is_file() else []
        except (OSError, UnicodeDecodeError):
            before = []
        order = list(dict.fromkeys(asked + before))[:HOT_TENANTS_MAX]
        try:
            atomic_write(Path(path), lambda fh: fh.write(("\n".join(order) + "\n").encode("utf-8")), durable=False)
        except OSError as exc:
            log.warning("could not write serve.hot_tenants_file %s: %s", path, exc)

    def refresh(self) -> bool:
        """Serve the newly published version, if any. A version built in another vector space
        (a rebuild with another embedder) is served only once its query embedder is loaded; if
        that fails (a contradicting config, a model that cannot load) the service keeps the
        version it has and logs why."""
        if not self.cache.may_have_changed():
            return False
        manifest = read_manifest(self.cache.store)
        if (self.own_embedder and manifest is not None and manifest.get("version") != self.cache.version
                and built_space(manifest) != self.space):
            try:
                embedder = load_embedder(self.cfg, manifest, str(self.cache.store))
            except Exception as exc:  # noqa: BLE001 - keep serving the loaded version
                log.error("not switching to store version %s: %s", manifest.get("version"), exc)
                return False
            changed = self.cache.refresh(embedder=embedder)
            if changed:
                self.space = built_space(manifest)
        else:
            changed = self.cache.refresh()
        if changed:
            self.broken = {}
            self._check_kept()
            self.metrics.reloads.inc()
            self.metrics.set_version(self.cache.version)
            log.info("now serving store version %s", self.cache.version)
        return changed

    # -- pieces ------------------------------------------------------------------------------
    def strategy(self, name: str) -> Strategy:
        inst = self._strategies.get(name)
        if inst is None:
            with self._lock:
                inst = self._strategies.get(name)
                if inst is None:
                    inst = get_strategy(name, self.cfg)
                    self._strategies[name] = inst
        return inst

    def index(self, tenant: str) -> TenantIndex:
        check_tenant_id(tenant)
        if not self.cache.has_tenant(tenant):
            raise ApiError(ErrorCode.UNKNOWN_TENANT, f"tenant {tenant!r} is not in store version {self.cache.version}")
        known = self.broken.get(tenant, "")
        if known.startswith(FILES_UNREADABLE):  # do not reread a corrupt file on every request
            raise ApiError(ErrorCode.TENANT_UNAVAILABLE, f"tenant {tenant!r} is unavailable: {known}")
        try:
            if tenant not in self.cache:  # cold: its files as published (a stat each once checked)
                bad = usable_damage(self.cache.reader.damage(tenant))
                if graph_only(bad):  # the strategies that read no graph still answer
                    self._broken(tenant, GRAPH_UNREADABLE, DamagedFileError(", ".join(map(str, bad[:3]))))
                elif bad:
                    raise DamagedFileError(f"published files damaged: {', '.join(map(str, bad[:3]))}")
            idx = self.cache.get(tenant)
        except KeyError:  # a version without this tenant was published in between
            raise ApiError(ErrorCode.UNKNOWN_TENANT, f"tenant {tenant!r} is not in the published store") from None
        except Exception as exc:  # noqa: BLE001 - a corrupt file of one tenant must not fail the others
            reason = self._broken(tenant, FILES_UNREADABLE, exc)
            raise ApiError(ErrorCode.TENANT_UNAVAILABLE, f"tenant {tenant!r} is unavailable: {reason}") from None
        self.metrics.cached.set(len(self.cache))
        return idx

    # -- endpoints ---------------------------------------------------------------------------
    def parse(self, authorization: str | None, raw: bytes,
              principal: Principal | None = None) -> tuple[Principal, SearchRequest]:
        """``principal``: already authenticated from ``authorization`` (before the body was read)."""
        principal = principal or self.auth.authenticate(authorization)
        req = parse_search(raw, self.limits, self.strategy_names)
        self.auth.authorize(principal, req.tenant)
        return principal, req

    def search(self, req: SearchRequest) -> SearchResponse:
        """Answer a validated, authorized request from one pinned store version. A cold tenant's
        query is encoded (by strategies that encode it) on another thread while the tenant opens."""
        t0 = time.perf_counter()
        strategy = self.strategy(req.strategy)
        if req.tenant not in self.cache and hasattr(strategy, "prefetch") and self.cache.has_tenant(req.tenant):
            try:
                self._ahead.submit(strategy.prefetch, req.query)
            except RuntimeError:  # stopping: the search encodes its own query
                pass
        idx = self.index(req.tenant)
        with self._lock:
            self.asked[req.tenant] += 1
        try:
            result = run_search(idx, strategy, req.query, req.k, **self._question_time(strategy, req))
        except DamagedFileError as exc:  # never answered from a damaged file, nor encoded anew (another ranking)
            if exc.part in PARTIAL:  # the graph, or Lance: the strategies that do not read it still answer
                reason = self._broken(req.tenant, PARTIAL[exc.part], exc)
                raise ApiError(ErrorCode.TENANT_UNAVAILABLE, f"strategy {req.strategy!r} needs the {exc.part} data of "
                                                             f"tenant {req.tenant!r}: {reason}") from None
            reason = self._broken(req.tenant, FILES_UNREADABLE, exc)
            raise ApiError(ErrorCode.TENANT_UNAVAILABLE, f"tenant {req.tenant!r} is unavailable: {reason}") from None
        except Exception as exc:
            graph = self._graph_error(req.tenant, idx)
            if graph is not None:
                raise ApiError(ErrorCode.TENANT_UNAVAILABLE, f"strategy {req.strategy!r} needs the graph of tenant "
                                                             f"{req.tenant!r}: {graph}") from None
            log.exception("strategy %s failed on tenant %s", req.strategy, req.tenant)
            raise ApiError(ErrorCode.SEARCH_FAILED, f"strategy {req.strategy!r} failed: {type(exc).__name__}: "
                                                    f"{' '.join(str(exc).split())[:200]}") from None
        speakers = {t.node_id: idx.turns[t.node_id].speaker for t in result.turns}
        return search_response(result, idx.version, req.k, (time.perf_counter() - t0) * 1000.0, speakers)

    @staticmethod
    def _question_time(strategy: Strategy, req: SearchRequest) -> dict[str, object]:
        """The request's ``question_time`` as a parameter of the strategies that take one (``auto``
        resolves relative dates against it; the others rank without dates)."""
        if req.question_time is None or "question_time" not in getattr(strategy, "defaults", {}):
            return {}
        return {"question_time": question_time(req.question_time)}

    def tenants(self, authorization: str | None) -> TenantsResponse:
        return self.visible_tenants(self.auth.authenticate(authorization))

    def visible_tenants(self, principal: Principal) -> TenantsResponse:
        known = self.cache.tenants()
        visible = known if principal.is_admin else [t for t in known if principal.may_access(t)]
        return TenantsResponse(version=self.cache.version, tenants=visible)

    # -- the same rules for MCP tools and the explorer's endpoints -----------------------------
    def search_request(self, principal: Principal, data: dict) -> SearchRequest:
        """A decoded search request (MCP tool arguments) validated and authorized exactly like a
        ``/v1/search`` body."""
        req = validate_search(data, self.limits, self.strategy_names)
        self.auth.authorize(principal, req.tenant)
        return req

    def authorized_index(self, principal: Principal, tenant: str) -> TenantIndex:
        check_tenant_id(tenant)
        self.auth.authorize(principal, tenant)
        return self.index(tenant)

    def session(self, principal: Principal, tenant: str, session_id: str, around: str | None = None,
                window: int = 5) -> SessionResponse:
        return session_view(self.authorized_index(principal, tenant), session_id, around, window)

    def node_graph(self, principal: Principal, tenant: str, node: str, depth: int = 2, limit: int = 40,
                   structural: bool = False) -> NodeGraphResponse:
        return node_graph(self.authorized_index(principal, tenant), node, depth, limit, structural)

    def health(self, authorization: str | None = None) -> HealthResponse:
        """Liveness needs no token; the reasons of broken tenants name their files only for the admin."""
        broken = dict(sorted(self.broken.items()))
        if not self._is_admin(authorization):
            broken = {t: without_paths(reason, self.cache.store) for t, reason in broken.items()}
        return HealthResponse(status="degraded" if broken else "ok", version=self.cache.version,
                              tenants=len(self.cache.tenants()), cached_tenants=len(self.cache),
                              strategies=self.strategy_names, broken=broken)

    def _is_admin(self, authorization: str | None) -> bool:
        try:
            return self.auth.authenticate(authorization).is_admin
        except ApiError:
            return False

    def reload(self, authorization: str | None) -> ReloadResponse:
        self.auth.require_admin(self.auth.authenticate(authorization))
        previous = self.cache.version
        changed = self.refresh()
        return ReloadResponse(changed=changed, version=self.cache.version, previous=previous)
