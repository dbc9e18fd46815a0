"""A bounded load generator against the retrieval service over loopback HTTP: questions from a
store, warm-up, timed ``POST /v1/search`` requests from client threads, and the same requests
as MCP ``search_memory`` tool calls to ``/mcp``, in rounds that rotate the arms. ``memlib bench
serve`` (jobs/cli/bench_serve.py) starts the service and prints the figures.

The MCP arms send the requests:

* through the official MCP SDK's client (what a Python agent pays, the SDK's own CPU
  included): ``concurrency`` sessions as tasks of one event loop, each opened (and its tool
  listing fetched) before the timed calls;
* on the wire (what the service adds): the very HTTP requests that client sends on a
  2026-07-28 connection (headers, JSON-RPC envelope, ``_meta``), from plain HTTP client
  threads like the ``/v1/search`` arm's.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

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


def timed_posts(http, path: str, bodies: Iterable[dict], accept: Callable[[Any], bool], label: str,
                out: list[float], errors: list[str], deadline: float) -> None:
    """POST each body to ``path`` one after another; ms of accepted answers to ``out``, every
    other outcome (status and text, transport error, past ``deadline``) to ``errors``."""
    import httpx

    for body in bodies:
        if time.monotonic() > deadline:
            errors.append("deadline")
            continue
        t0 = time.perf_counter()
        try:
            r = http.post(path, json=body)
            ok, detail = accept(r), f"{label}{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            ok, detail = False, f"{label}{type(exc).__name__}: {exc}"
        if ok:
            out.append((time.perf_counter() - t0) * 1000.0)
        else:
            errors.append(detail)


def _worker(base_url: str, token: str, jobs: list[dict], out: list[float], errors: list[str],
            deadline: float) -> None:
    """``jobs`` as ``POST /v1/search`` requests, one after another."""
    import httpx

    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30.0) as http:
        timed_posts(http, "/v1/search", jobs, lambda r: r.status_code == 200, "", out, errors, deadline)


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


def warm_up(base_url: str, token: str, strategy: str, questions: list[tuple[str, str]], concurrency: int,
            k: int, max_seconds: float, mcp: bool) -> float:
    """Untimed first queries of ``strategy`` (:func:`warmup_questions`) on every arm; seconds."""
    started = time.perf_counter()
    warm = warmup_questions(questions)
    run_load(base_url, token, strategy, warm, len(warm), concurrency, k, max_seconds)
    if mcp:

        run_load(base_url, token, strategy, warm, len(warm), concurrency, k, max_seconds, wire_worker)
        collect_mcp(base_url, token, _bodies(strategy, warm, len(warm), k), concurrency, max_seconds)
    return round(time.perf_counter() - started, 2)


def measure(base_url: str, token: str, strategy: str, questions: list[tuple[str, str]], n: int,
            concurrency: int, k: int, max_seconds: float, mcp: bool) -> tuple[dict, list[str]]:
    """Warm-up, then ``n`` timed requests of ``strategy`` (paired with the MCP arms when ``mcp``):
    (figures with ``warmup_s`` and, with ``mcp``, each MCP arm and what it adds to the p50)."""
    warmup_s = warm_up(base_url, token, strategy, questions, concurrency, k, max_seconds, mcp)
    if not mcp:
        figures, errors = run_load(base_url, token, strategy, questions, n, concurrency, k, max_seconds)
        return {**figures, "warmup_s": warmup_s}, errors
    arms, errors = run_paired(base_url, token, strategy, questions, n, concurrency, k, max_seconds)
    figures = arms["http"]
    for arm in ("mcp_wire", "mcp"):
        figures[arm] = arms[arm]
        if figures["p50_ms"] is not None and arms[arm]["p50_ms"] is not None:
            figures[f"{arm}_added_p50_ms"] = round(arms[arm]["p50_ms"] - figures["p50_ms"], 2)
    figures["warmup_s"] = warmup_s
    return figures, errors


# ---- the MCP arms ----------------------------------------------------------------------------
TOOL = "search_memory"
PROTOCOL = "2026-07-28"
WIRE_HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": PROTOCOL,
                "Mcp-Method": "tools/call", "Mcp-Name": TOOL}
WIRE_META = {"io.modelcontextprotocol/protocolVersion": PROTOCOL,
             "io.modelcontextprotocol/clientInfo": {"name": "memlib-bench", "version": "1"},
             "io.modelcontextprotocol/clientCapabilities": {}}


def wire_worker(base_url: str, token: str, jobs: list[dict], out: list[float], errors: list[str],
                deadline: float) -> None:
    """``jobs`` as JSON-RPC ``tools/call`` POSTs to ``/mcp``, one after another; ms to ``out``."""
    import httpx

    ids = itertools.count(1)
    headers = {**WIRE_HEADERS, "Authorization": f"Bearer {token}"}
    envelopes = ({"jsonrpc": "2.0", "id": next(ids), "method": "tools/call",
                  "params": {"name": TOOL, "arguments": args, "_meta": WIRE_META}} for args in jobs)
    with httpx.Client(base_url=base_url, headers=headers, timeout=30.0) as http:
        timed_posts(http, "/mcp", envelopes, lambda r: r.status_code == 200 and b'"isError":false' in r.content,
                    "mcp wire ", out, errors, deadline)


def collect_mcp(base_url: str, token: str, bodies: list[dict], concurrency: int,
                max_seconds: float) -> tuple[list[float], list[str], float]:
    """Send ``bodies`` (``/v1/search`` bodies) as tool calls from ``concurrency`` sessions;
    (latencies ms, error details, wall seconds of the timed calls)."""
    import anyio
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + max_seconds

    async def session(jobs: list[dict], ready: anyio.Event, go: anyio.Event, opened: list[int]) -> None:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30.0) as http:
            async with Client(streamable_http_client(f"{base_url}/mcp", http_client=http)) as client:
                await client.list_tools()
                opened.append(1)
                if len(opened) == concurrency:
                    ready.set()
                await go.wait()
                for args in jobs:
                    await call(client, args)

    async def call(client, args: dict) -> None:
        if time.monotonic() > deadline:
            errors.append("deadline")
            return
        t0 = time.perf_counter()
        try:
            res = await client.call_tool(TOOL, args)
            ok, detail = not res.is_error, (res.content[0].text[:200] if res.content else "")
        except Exception as exc:  # noqa: BLE001 - every failure is a counted error
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        if ok:
            latencies.append((time.perf_counter() - t0) * 1000.0)
        else:
            errors.append(f"mcp {detail}")

    async def main() -> float:
        ready, go, opened = anyio.Event(), anyio.Event(), []
        async with anyio.create_task_group() as tg:
            for i in range(concurrency):
                tg.start_soon(session, bodies[i::concurrency], ready, go, opened)
            await ready.wait()
            t0 = time.perf_counter()
            go.set()
        return time.perf_counter() - t0

    try:
        wall = anyio.run(main)
    except Exception as exc:  # noqa: BLE001 - a session that cannot open is a counted error
        errors.append(f"mcp session: {type(exc).__name__}: {exc}")
        wall = 0.0
    return latencies, errors, wall
