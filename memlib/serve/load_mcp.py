"""The MCP arms of ``memlib bench serve``: the same search requests as ``POST /v1/search``, sent
as ``search_memory`` tool calls to ``/mcp``

* through the official MCP SDK's client (what a Python agent pays, the SDK's own CPU
  included): ``concurrency`` sessions as tasks of one event loop, each opened (and its tool
  listing fetched) before the timed calls;
* on the wire (what the service adds): the very HTTP requests that client sends on a
  2026-07-28 connection (headers, JSON-RPC envelope, ``_meta``), from plain HTTP client
  threads like the ``/v1/search`` arm's.
"""
from __future__ import annotations

import itertools
import time

from memlib.serve.load import timed_posts

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
