"""Prometheus metrics of one service instance (its own registry, so several instances in
one process — tests, replicas — never collide)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
NO_STRATEGY = "-"


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
