"""``memlib bench serve``: a bounded loopback load against the real Ray Serve service.

Starts the service on a free loopback port with a fresh admin token, draws questions from
the store's ``questions`` table (turn texts when a store has none), warms each strategy with
one question of every tenant plus a few more (untimed, reported as ``warmup_s``), sends
``--requests`` requests per strategy from ``--concurrency`` client threads, and prints one
JSON line: ``{"strategies": {NAME: {"p50_ms", "p95_ms", "p99_ms", "qps", "requests",
"warmup_s", "mcp_wire": {...}, "mcp": {...}, "mcp_wire_added_p50_ms", "mcp_added_p50_ms"}},
"errors": N}``. Latency is client-side (HTTP round trip through the Serve proxy). With
``--mcp`` (the default) the same requests are also sent as MCP ``search_memory`` calls to
``/mcp``, as plain HTTP requests of the MCP wire protocol (``mcp_wire``: what the service's
MCP layer adds) and through the official SDK's client (``mcp``: plus the client's own cost),
in rounds that rotate the three arms (:mod:`jobs.cli.load_mcp`)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Annotated, Callable, Optional

import numpy as np
import typer

from jobs.cli.common import ConfigOpt, SetOpt, fail, get_config

WARMUP_PER_STRATEGY = 20


def load_questions(store: Path, limit: int = 5_000) -> list[tuple[str, str]]:
    """(tenant, question) pairs from the store: its questions table, else turn texts."""
    from memlib.io.store import StoreReader

    reader = StoreReader(store)
    tbl = reader.table("questions", columns=["tenant_id", "question"])
    if tbl.num_rows == 0:
        tbl = reader.table("turns", columns=["tenant_id", "text"]).rename_columns(["tenant_id", "question"])
    tbl = tbl.filter(tbl.column("question").is_valid()).slice(0, limit)
    return list(zip(tbl.column("tenant_id").to_pylist(), tbl.column("question").to_pylist()))


def warmup_questions(questions: list[tuple[str, str]], extra: int = WARMUP_PER_STRATEGY) -> list[tuple[str, str]]:
    """One question of every tenant (a cold tenant's first query builds its caches, e.g. auto's
    token matrix), then ``extra`` more."""
    first: dict[str, tuple[str, str]] = {}
    for tenant, question in questions:
        first.setdefault(tenant, (tenant, question))
    return list(first.values()) + questions[:extra]


def _worker(base_url: str, token: str, jobs: list[dict], out: list[float], errors: list[str],
            deadline: float) -> None:
    import httpx

    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30.0) as http:
        for body in jobs:
            if time.monotonic() > deadline:
                errors.append("deadline")
                continue
            t0 = time.perf_counter()
            try:
                r = http.post("/v1/search", json=body)
                ok = r.status_code == 200
                detail = f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as exc:
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            if ok:
                out.append((time.perf_counter() - t0) * 1000.0)
            else:
                errors.append(detail)


Worker = Callable[[str, str, list[dict], list[float], list[str], float], None]


def _collect(base_url: str, token: str, bodies: list[dict], concurrency: int, max_seconds: float,
             worker: Worker) -> tuple[list[float], list[str], float]:
    """Send ``bodies`` from ``concurrency`` threads; (latencies ms, error details, wall seconds)."""
    lat: list[list[float]] = [[] for _ in range(concurrency)]
    errs: list[list[str]] = [[] for _ in range(concurrency)]
    deadline = time.monotonic() + max_seconds
    threads = [threading.Thread(target=worker, args=(base_url, token, bodies[i::concurrency], lat[i], errs[i],
                                                     deadline)) for i in range(concurrency)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return [x for part in lat for x in part], [e for part in errs for e in part], time.perf_counter() - t0


def _figures(latencies: list[float], wall: float) -> dict:
    ms = np.asarray(latencies, dtype=np.float64)
    figures = {"p50_ms": None, "p95_ms": None, "p99_ms": None, "qps": 0.0, "requests": int(ms.size)}
    if ms.size:
        p50, p95, p99 = np.percentile(ms, [50, 95, 99])
        figures.update(p50_ms=round(float(p50), 2), p95_ms=round(float(p95), 2), p99_ms=round(float(p99), 2),
                       qps=round(ms.size / max(wall, 1e-9), 1))
    return figures


def _bodies(strategy: str, questions: list[tuple[str, str]], n: int, k: int) -> list[dict]:
    return [{"tenant": t, "query": q, "strategy": strategy, "k": k}
            for t, q in (questions[i % len(questions)] for i in range(n))]


def run_load(base_url: str, token: str, strategy: str, questions: list[tuple[str, str]], n: int,
             concurrency: int, k: int, max_seconds: float, worker: Worker = _worker) -> tuple[dict, list[str]]:
    """``n`` requests of ``strategy`` from ``concurrency`` threads; (figures, error details)."""
    latencies, errors, wall = _collect(base_url, token, _bodies(strategy, questions, n, k), concurrency,
                                       max_seconds, worker)
    return _figures(latencies, wall), errors


ARMS = ("http", "mcp_wire", "mcp")


def run_paired(base_url: str, token: str, strategy: str, questions: list[tuple[str, str]], n: int,
               concurrency: int, k: int, max_seconds: float, rounds: int = 4) -> tuple[dict[str, dict], list[str]]:
    """The same ``n`` requests through ``POST /v1/search`` (``http``), as MCP ``search_memory`` calls
    on the wire (``mcp_wire``) and through the MCP SDK's client (``mcp``), in rounds that rotate
    the order of the arms (a change in the machine's load hits them alike); (figures per arm,
    error details)."""
    from jobs.cli.load_mcp import collect_mcp, wire_worker

    bodies = _bodies(strategy, questions, n, k)
    budget = max_seconds / (len(ARMS) * rounds)
    got: dict[str, tuple[list[float], float]] = {arm: ([], 0.0) for arm in ARMS}
    errors: list[str] = []
    step = -(-len(bodies) // rounds)
    for r in range(rounds):
        chunk = bodies[r * step:(r + 1) * step]
        for arm in ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]:
            if arm == "mcp":
                lat, errs, wall = collect_mcp(base_url, token, chunk, concurrency, budget)
            else:
                worker = _worker if arm == "http" else wire_worker
                lat, errs, wall = _collect(base_url, token, chunk, concurrency, budget, worker)
            got[arm] = (got[arm][0] + lat, got[arm][1] + wall)
            errors.extend(errs)
    return {arm: _figures(*got[arm]) for arm in ARMS}, errors


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("serve")
    def bench_serve(
        store: Annotated[Path, typer.Option("--store", "-s", help="memory store directory")],
        requests: Annotated[int, typer.Option("--requests", help="requests per strategy (>= 1)")] = 2000,
        concurrency: Annotated[int, typer.Option("--concurrency", help="concurrent client threads")] = 4,
        strategies: Annotated[str, typer.Option("--strategies", help="comma-separated")] = "auto,bm25,dense,hybrid",
        k: Annotated[int, typer.Option("--k", help="k of every request")] = 10,
        max_seconds: Annotated[float, typer.Option("--max-seconds", help="time bound per strategy")] = 600.0,
        replicas: Annotated[Optional[int], typer.Option("--replicas", help="default: serve.replicas")] = None,
        mcp: Annotated[bool, typer.Option("--mcp/--no-mcp", help="also send every request as an MCP search_memory "
                                          "call (official SDK client, /mcp) and report both")] = True,
        config: ConfigOpt = None,
        overrides: SetOpt = None,
    ) -> None:
        """Loopback load against `memlib serve`; prints one JSON line of latency figures."""
        from memlib.retrieve.registry import parse_strategies
        from memlib.serve.auth import hash_token, new_token

        cfg = get_config(config, overrides)
        try:
            names = parse_strategies(strategies)
        except KeyError as exc:
            fail(str(exc))
            return
        questions = load_questions(store)
        if not questions or requests < 1 or concurrency < 1:
            fail("need a store with questions or turns, --requests >= 1 and --concurrency >= 1")
        token = new_token()
        cfg.serve.admin_token_hash = hash_token(token)
        cfg.serve.auth_enabled = True
        if replicas is not None:
            cfg.serve.replicas = replicas
        from jobs.serve import free_port, start, stop

        base_url = start(store, cfg, host="127.0.0.1", port=free_port())
        result: dict = {"strategies": {}, "errors": 0, "concurrency": concurrency, "replicas": cfg.serve.replicas,
                        "questions": len(questions), "store": str(store)}
        samples: list[str] = []
        try:
            warm = warmup_questions(questions)
            for name in names:
                started = time.perf_counter()
                run_load(base_url, token, name, warm, len(warm), concurrency, k, max_seconds)
                if mcp:
                    from jobs.cli.load_mcp import collect_mcp, wire_worker

                    run_load(base_url, token, name, warm, len(warm), concurrency, k, max_seconds, wire_worker)
                    collect_mcp(base_url, token, _bodies(name, warm, len(warm), k), concurrency, max_seconds)
                warmup_s = round(time.perf_counter() - started, 2)
                if mcp:
                    arms, errors = run_paired(base_url, token, name, questions, requests, concurrency, k,
                                              max_seconds)
                    figures = arms["http"]
                    for arm in ("mcp_wire", "mcp"):
                        figures[arm] = arms[arm]
                        if figures["p50_ms"] is not None and arms[arm]["p50_ms"] is not None:
                            figures[f"{arm}_added_p50_ms"] = round(arms[arm]["p50_ms"] - figures["p50_ms"], 2)
                else:
                    figures, errors = run_load(base_url, token, name, questions, requests, concurrency, k,
                                               max_seconds)
                figures["warmup_s"] = warmup_s
                result["strategies"][name] = figures
                result["errors"] += len(errors)
                samples.extend(errors[:3])
        finally:
            stop()
        if samples:
            result["error_samples"] = samples[:5]
        typer.echo(json.dumps(result))
        if result["errors"]:
            raise typer.Exit(1)
