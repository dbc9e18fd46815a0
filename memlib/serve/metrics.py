"""Prometheus metrics of one service instance (its own registry, so several instances in
one process — tests, replicas — never collide)."""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
NO_STRATEGY = "-"


class CacheCollector:
    """The tenant cache's counts and bytes, read when /metrics is rendered."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def collect(self):
        st = self.cache.stats
        for name, doc, value in (("hits", "tenant cache hits", st.hits),
                                 ("misses", "tenant cache misses (a tenant opened)", st.misses),
                                 ("evictions", "tenants evicted to stay within the cache's bounds", st.evictions),
                                 ("kept_on_refresh", "loaded tenants a new store version did not change, kept loaded",
                                  st.kept_on_refresh),
                                 ("dropped_on_refresh", "loaded tenants a new store version rebuilt or removed",
                                  st.dropped_on_refresh)):
            yield CounterMetricFamily(f"memlib_cache_{name}", doc, value=value)
        yield GaugeMetricFamily("memlib_cache_bytes", "bytes of the tenants loaded in this replica",
                                value=self.cache.nbytes)
        if self.cache.max_bytes is not None:
            yield GaugeMetricFamily("memlib_cache_max_bytes", "serve.cache_bytes of this replica",
                                    value=self.cache.max_bytes)


class ServiceMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("memlib_requests", "HTTP requests by endpoint, status and strategy",
                                ["endpoint", "status", "strategy"], registry=self.registry)
        self.latency = Histogram("memlib_search_latency_seconds", "server-side latency of /v1/search",
                                 ["strategy"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.cached = Gauge("memlib_cached_tenants", "tenants loaded in this replica", registry=self.registry)
        self.reloads = Counter("memlib_store_reloads", "store versions picked up without restart",
                               registry=self.registry)
        self.version = Gauge("memlib_store_version", "published store version number being served",
                             registry=self.registry)
        self.tenant_load = Histogram("memlib_tenant_load_seconds", "seconds a cold tenant took to open",
                                     buckets=LATENCY_BUCKETS, registry=self.registry)

    def watch_cache(self, cache: Any) -> None:
        """Export ``cache``'s counts and bytes (memlib.retrieve.tenant.TenantCache)."""
        self.registry.register(CacheCollector(cache))

    def observe(self, endpoint: str, status: int, strategy: str | None = None, seconds: float | None = None) -> None:
        name = strategy or NO_STRATEGY
        self.requests.labels(endpoint=endpoint, status=str(status), strategy=name).inc()
        if seconds is not None and status == 200:
            self.latency.labels(strategy=name).observe(seconds)

    def set_version(self, version: str) -> None:
        digits = version.lstrip("v")
        if digits.isdigit():
            self.version.set(int(digits))

    def render(self) -> bytes:
        return generate_latest(self.registry)
