"""Serving many tenants: requests spread over a store's tenants by a Zipf law, a tenant cache
holding a share of them, several clients; optionally a nightly run published in the middle.

Used by ``memlib bench serve --zipf S`` (jobs/cli/bench_serve.py). In process (the default) the
clients call one :class:`~memlib.serve.service.SearchService` from threads, as a replica's
request handlers do; with ``--http`` they send ``POST /v1/search`` to the Ray Serve service and
the cache's counts come from its ``/metrics``.

A request is *cold* when its tenant was not loaded when it was sent. The hit rate is the cache's
own count (hits / (hits + misses)) over a time window, sampled every second.
"""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memlib.config import MemlibConfig

WINDOW_S = 60.0  # the minute before and after a publish


def zipf_draws(tenants: list[str], n: int, exponent: float, seed: int = 0) -> list[str]:
    """``n`` tenants drawn with P(rank r) proportional to r^-exponent, ranks a shuffle of ``tenants``."""
    rng = random.Random(seed)
    order = list(tenants)
    rng.shuffle(order)
    weights = np.array([1.0 / (r ** exponent) for r in range(1, len(order) + 1)])
    cdf = np.cumsum(weights / weights.sum())
    picks = np.searchsorted(cdf, np.random.default_rng(seed).random(n), side="right")
    return [order[min(int(i), len(order) - 1)] for i in picks]


def tenant_queries(store: Path, per_tenant: int = 3) -> dict[str, list[str]]:
    """Up to ``per_tenant`` queries of every tenant: its questions, else its turn texts."""
    from memlib.io.store import StoreReader

    reader = StoreReader(store)
    out: dict[str, list[str]] = {}
    for name, column in (("questions", "question"), ("turns", "text")):
        tbl = reader.table(name, columns=["tenant_id", column])
        for tenant, text in zip(tbl.column("tenant_id").to_pylist(), tbl.column(column).to_pylist()):
            if text and len(out.setdefault(tenant, [])) < per_tenant:
                out[tenant].append(" ".join(text.split()[:24]))
        if out:
            break
    return out


@dataclass
class Log:
    """Every timed request, and the cache's counts sampled every second."""
    requests: list[tuple[float, str, float, bool]] = field(default_factory=list)  # (t, strategy, ms, cold)
    counts: list[tuple[float, int, int]] = field(default_factory=list)           # (t, hits, misses)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, t: float, strategy: str, ms: float, cold: bool) -> None:
        with self.lock:
            self.requests.append((t, strategy, ms, cold))


def _pct(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    p50, p95, p99 = np.percentile(np.asarray(values), [50, 95, 99])
    return {"p50_ms": round(float(p50), 2), "p95_ms": round(float(p95), 2), "p99_ms": round(float(p99), 2)}


def hit_rate(counts: list[tuple[float, int, int]], start: float, end: float) -> float | None:
    """hits / (hits + misses) between the samples nearest ``start`` and ``end``."""
    inside = [c for c in counts if start <= c[0] <= end]
    if len(inside) < 2:
        return None
    (_, h0, m0), (_, h1, m1) = inside[0], inside[-1]
    asked = (h1 - h0) + (m1 - m0)
    return round((h1 - h0) / asked, 4) if asked else None


def summarize(log: Log, strategies: list[str], start: float, end: float) -> dict[str, Any]:
    """Per strategy: latency percentiles of all requests and of cold ones, between ``start`` and ``end``."""
    out: dict[str, Any] = {}
    for name in strategies:
        rows = [r for r in log.requests if r[1] == name and start <= r[0] <= end]
        cold = [r[2] for r in rows if r[3]]
        out[name] = {**_pct([r[2] for r in rows]), "requests": len(rows), "cold_requests": len(cold),
                     **{f"cold_{k}": v for k, v in _pct(cold).items()}}
    return out


class InProcess:
    """The clients call one SearchService from threads."""

    def __init__(self, store: Path, cfg: MemlibConfig, embedder: Any = None):
        from memlib.serve.service import SearchService

        self.service = SearchService(store, cfg, embedder=embedder).start(freeze_gc=True)

    def search(self, tenant: str, query: str, strategy: str, k: int) -> bool:
        """Run one search; whether its tenant was cold."""
        from memlib.serve.models import SearchRequest

        cold = tenant not in self.service.cache
        self.service.search(SearchRequest(tenant=tenant, query=query, strategy=strategy, k=k))
        return cold

    def counts(self) -> tuple[int, int]:
        st = self.service.cache.stats
        return st.hits, st.misses

    def info(self) -> dict[str, Any]:
        cache, st = self.service.cache, self.service.cache.stats
        opened = np.asarray(st.load_s or [0.0]) * 1000.0
        rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
        kib = lambda key: int(status.get(key, "0 kB").split()[0])  # noqa: E731
        return {"version": cache.version, "cached_tenants": len(cache), "cache_bytes": cache.nbytes,
                "evictions": st.evictions, "kept_on_refresh": st.kept_on_refresh,
                "dropped_on_refresh": st.dropped_on_refresh,
                "open_p50_ms": round(float(np.percentile(opened, 50)), 2),
                "open_p99_ms": round(float(np.percentile(opened, 99)), 2), "rss_mb": round(rss / 2**20, 1),
                # of the RSS: the process's own memory, and pages of mapped store files (tenant views,
                # kept token vectors: page cache the kernel may drop and read again)
                "rss_anon_mb": round(kib("RssAnon") / 1024, 1), "rss_file_mb": round(kib("RssFile") / 1024, 1)}

    def version(self) -> str:
        return self.service.cache.version

    def close(self) -> None:
        self.service.stop()


class OverHttp:
    """The clients send ``POST /v1/search`` to a running service (one HTTP connection per thread);
    the cache's counts come from its ``/metrics`` (one replica: its own counts)."""

    def __init__(self, base_url: str, token: str):
        self.base_url, self.token = base_url, token
        self._local = threading.local()

    def _http(self):
        import httpx

        if getattr(self._local, "http", None) is None:
            self._local.http = httpx.Client(base_url=self.base_url, timeout=60.0,
                                            headers={"Authorization": f"Bearer {self.token}"})
        return self._local.http

    def search(self, tenant: str, query: str, strategy: str, k: int) -> bool:
        r = self._http().post("/v1/search", json={"tenant": tenant, "query": query, "strategy": strategy, "k": k})
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        return False  # not known from outside the replica

    def _metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in self._http().get("/metrics").text.splitlines():
            if line.startswith("memlib_") and " " in line:
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    continue
        return out

    def counts(self) -> tuple[int, int]:
        m = self._metrics()
        return int(m.get("memlib_cache_hits_total", 0)), int(m.get("memlib_cache_misses_total", 0))

    def info(self) -> dict[str, Any]:
        m = self._metrics()
        return {"version": self.version(), "cache_bytes": int(m.get("memlib_cache_bytes", 0)),
                "evictions": int(m.get("memlib_cache_evictions_total", 0)),
                "kept_on_refresh": int(m.get("memlib_cache_kept_on_refresh_total", 0)),
                "dropped_on_refresh": int(m.get("memlib_cache_dropped_on_refresh_total", 0))}

    def version(self) -> str:
        return self._http().get("/healthz").json()["version"]

    def close(self) -> None:
        from jobs.serve import stop

        stop()


def run(client: Any, queries: dict[str, list[str]], strategies: list[str], requests: int, clients: int,
        exponent: float, k: int, warm: int, publish: Callable[[], subprocess.Popen] | None = None,
        publish_after_s: float = 30.0, max_seconds: float = 3600.0) -> dict[str, Any]:
    """``warm`` untimed requests, then ``requests`` timed ones (every strategy in turn), from
    ``clients`` threads; with ``publish``, a nightly run started ``publish_after_s`` into the timed
    phase, and the load kept up until a minute after its version is served."""
    tenants = sorted(queries)
    draws = zipf_draws(tenants, warm + requests, exponent, seed=1)
    rng = random.Random(2)
    jobs = [(t, rng.choice(queries[t]), strategies[i % len(strategies)]) for i, t in enumerate(draws)]
    log = Log()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            log.counts.append((time.monotonic(), *client.counts()))
            stop.wait(1.0)

    def worker(mine: list[tuple[str, str, str]], timed: bool, deadline: float) -> None:
        i = 0
        while i < len(mine) or (timed and publish is not None and not stop.is_set()):
            if time.monotonic() > deadline:
                break
            tenant, query, strategy = mine[i % len(mine)]
            i += 1
            t0 = time.perf_counter()
            try:
                cold = client.search(tenant, query, strategy, k)
            except Exception as exc:  # noqa: BLE001 - counted and sampled in the report
                log.errors.append(f"{tenant}: {type(exc).__name__}: {exc}"[:300])
                continue
            if timed:  # with a publish, the same requests go round until it is measured
                log.add(time.monotonic(), strategy, (time.perf_counter() - t0) * 1000.0, cold)

    def phase(part: list[tuple[str, str, str]], timed: bool) -> list[threading.Thread]:
        deadline = time.monotonic() + max_seconds
        threads = [threading.Thread(target=worker, args=(part[i::clients], timed, deadline)) for i in range(clients)]
        for th in threads:
            th.start()
        return threads

    for th in phase(jobs[:warm], timed=False):
        th.join()
    start = time.monotonic()
    log.counts.append((start, *client.counts()))  # the window's first sample, however short the run
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = phase(jobs[warm:], timed=True)
    out: dict[str, Any] = {}
    began = None
    if publish is not None:
        time.sleep(publish_after_s)
        before = client.version()
        began = time.monotonic()
        proc = publish()
        code = proc.wait()
        out["publish"] = {"build_exit": code, "build_wall_s": round(time.monotonic() - began, 1)}
        swapped = None
        while time.monotonic() - began < max_seconds:
            if client.version() != before:
                swapped = time.monotonic()
                break
            time.sleep(0.2)
        if swapped is not None:
            time.sleep(WINDOW_S)
        stop.set()
        if swapped is not None:
            out["publish"].update(
                version=client.version(), served_after_build_s=round(swapped - began, 1),
                hit_rate_minute_before=hit_rate(log.counts, began - WINDOW_S, began),
                hit_rate_minute_after=hit_rate(log.counts, swapped, swapped + WINDOW_S),
                minute_before=summarize(log, strategies, began - WINDOW_S, began),
                minute_after=summarize(log, strategies, swapped, swapped + WINDOW_S))
    for th in threads:
        th.join()
    stop.set()
    log.counts.append((time.monotonic(), *client.counts()))
    steady = began if began is not None else time.monotonic()  # before the publish, if any
    out.update(strategies=summarize(log, strategies, start, steady), hit_rate=hit_rate(log.counts, start, steady),
               errors=len(log.errors), error_samples=log.errors[:3], **client.info())
    return out


def nightly_publisher(store: Path, nightly_input: Path, log_path: Path) -> Callable[[], subprocess.Popen]:
    """A function starting ``memlib build --incremental`` of ``nightly_input`` into ``store``."""
    def start() -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        cmd = [sys.executable, "-m", "jobs.cli", "build", "--incremental", "--input", str(nightly_input),
               "--format", "jsonl", "--out", str(store)]
        return subprocess.Popen(cmd, env=env, stdout=log_path.open("w"), stderr=subprocess.STDOUT)
    return start


def cache_tenants_for(share: float, tenants: int) -> int:
    return max(1, math.ceil(share * tenants))


def cold_round_robin(store: Path, cfg: MemlibConfig, strategies: list[str], rounds: int, k: int,
                     embedder: Any = None) -> dict[str, Any]:
    """Every request cold: one client asks the store's tenants in turn, the cache holding one
    tenant; per strategy the latency of those first queries, and of a second query to the same
    tenant right after (warm), in the same run."""
    queries = tenant_queries(store)
    tenants = sorted(queries)
    if len(tenants) < 2:
        raise ValueError(f"{store}: --cold needs at least two tenants with questions or turns")
    cfg.serve.cache_tenants, cfg.serve.preload_tenants = 1, 0
    client = InProcess(store, cfg, embedder=embedder)
    out: dict[str, Any] = {"tenants": len(tenants), "rounds": rounds, "strategies": {}}
    try:
        for name in strategies:
            cold, warm = [], []
            for r in range(rounds):
                for t in tenants:
                    q = queries[t][r % len(queries[t])]
                    t0 = time.perf_counter()
                    was_cold = client.search(t, q, name, k)
                    t1 = time.perf_counter()
                    client.search(t, queries[t][(r + 1) % len(queries[t])], name, k)
                    t2 = time.perf_counter()
                    if was_cold:
                        cold.append((t1 - t0) * 1000.0)
                        warm.append((t2 - t1) * 1000.0)
            out["strategies"][name] = {"cold": _pct(cold), "warm": _pct(warm), "cold_requests": len(cold),
                                       "cold_over_warm_p50": round(float(np.median(cold) / np.median(warm)), 2)
                                       if cold else None}
        out.update(client.info())
    finally:
        client.close()
    return out
