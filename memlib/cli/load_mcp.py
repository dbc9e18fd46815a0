"""The MCP arm of ``memlib bench serve``: the same search requests as ``POST /v1/search``, sent as
``search_memory`` tool calls through the official MCP SDK's client over streamable HTTP (what
a Python agent pays). ``concurrency`` client sessions run as tasks of one event loop (the
SDK's client is asyncio code; one loop per thread would add thread switches under the GIL to
every call); each session is opened, and its tool listing fetched, before the timed calls."""
from __future__ import annotations

import time

TOOL = "search_memory"


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
