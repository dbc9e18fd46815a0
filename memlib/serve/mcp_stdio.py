"""The MCP server over stdio (``memlib mcp --store STORE --tenant T``): a desktop agent starts
it as a subprocess and speaks JSON-RPC on its stdin/stdout. It reads the store directly (no Ray,
no HTTP); the store's files are the caller's, so there are no tokens: ``--tenant`` binds the
connection to one tenant (other tenants are refused like a tenant token's would be), and
without it every tenant of the store is reachable."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from memlib.config import MemlibConfig
from memlib.serve.auth import Principal, Role
from memlib.serve.mcp_tools import build_server
from memlib.serve.service import SearchService


def stdio_principal(tenant: str | None) -> Principal:
    return Principal(Role.TENANT, tenant, bound_by="memlib mcp --tenant") if tenant else Principal(Role.OPEN)


def unreadable_answer(exc: Exception) -> types.JSONRPCError:
    """The JSON-RPC answer to a line the transport could not read (id null, as JSON-RPC 2.0 says):
    -32700 when it is not JSON, -32600 when it is JSON but no JSON-RPC message."""
    not_json = not isinstance(exc, ValidationError) or any(e.get("type") == "json_invalid" for e in exc.errors())
    code, what = (types.PARSE_ERROR, "Parse error: the line is not JSON") if not_json else \
        (types.INVALID_REQUEST, "Invalid Request: the line is JSON but no JSON-RPC 2.0 message")
    return types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(code=code, message=what))


async def answer_unreadable(read: Any, write: Any, to_server: Any) -> None:
    """Pass the transport's messages on to the server; answer each line it could not read (the SDK's
    stdio transport yields an exception for it, which the server only logs, leaving the client waiting)."""
    async with to_server:
        async for item in read:
            if isinstance(item, Exception):
                await write.send(SessionMessage(unreadable_answer(item)))
            else:
                await to_server.send(item)


async def serve_stdio(store: Path, cfg: MemlibConfig, tenant: str | None) -> None:
    """Serve until the client closes stdin. The service is built after the SDK has claimed the
    process's stdout, so anything a library prints while loading goes to stderr, not the wire."""
    principal = stdio_principal(tenant)
    async with stdio_server() as (read, write), anyio.create_task_group() as tg:
        to_server, from_relay = anyio.create_memory_object_stream[Any](0)
        tg.start_soon(answer_unreadable, read, write, to_server)
        service = await anyio.to_thread.run_sync(lambda: SearchService(store, cfg).start())
        try:
            server = build_server(service, lambda ctx: principal)
            await server.run(from_relay, write, server.create_initialization_options())
        finally:
            service.stop()


def run_stdio(store: Path, cfg: MemlibConfig, tenant: str | None) -> None:
    anyio.run(serve_stdio, store, cfg, tenant)
