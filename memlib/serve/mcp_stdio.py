"""The MCP server over stdio (``memlib mcp --store STORE --tenant T``): a desktop agent starts
it as a subprocess and speaks JSON-RPC on its stdin/stdout. It reads the store directly (no Ray,
no HTTP); the store's files are the caller's, so there are no tokens: ``--tenant`` binds the
connection to one tenant (other tenants are refused like a tenant token's would be), and
without it every tenant of the store is reachable."""
from __future__ import annotations

from pathlib import Path

import anyio
from mcp.server.stdio import stdio_server

from memlib.config import MemlibConfig
from memlib.serve.auth import Principal, Role
from memlib.serve.mcp_tools import build_server
from memlib.serve.service import SearchService


def stdio_principal(tenant: str | None) -> Principal:
    return Principal(Role.TENANT, tenant) if tenant else Principal(Role.OPEN)


async def serve_stdio(store: Path, cfg: MemlibConfig, tenant: str | None) -> None:
    """Serve until the client closes stdin. The service is built after the SDK has claimed the
    process's stdout, so anything a library prints while loading goes to stderr, not the wire."""
    principal = stdio_principal(tenant)
    async with stdio_server() as (read, write):
        service = await anyio.to_thread.run_sync(lambda: SearchService(store, cfg).start())
        try:
            server = build_server(service, lambda ctx: principal)
            await server.run(read, write, server.create_initialization_options())
        finally:
            service.stop()


def run_stdio(store: Path, cfg: MemlibConfig, tenant: str | None) -> None:
    anyio.run(serve_stdio, store, cfg, tenant)
