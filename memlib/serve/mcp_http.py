"""The MCP server over streamable HTTP, mounted at ``/mcp`` in the service's FastAPI app.

Stateless and JSON-answered (no ``Mcp-Session-Id``, no server-sent streams): every POST
carries one JSON-RPC request and is answered by itself, so any replica behind the Serve proxy
can take any request and nothing is kept between them.

In front of the SDK's handler sits :class:`McpHttp`, a small ASGI gate with the rules of
``/v1/search``: no or an unknown bearer token -> HTTP 401; a ``tools/call`` naming a tenant the
token may not query -> HTTP 403. Both answers carry a JSON-RPC error (code
:data:`UNAUTHENTICATED` / :data:`FORBIDDEN`, ``data`` = ``{"error", "reason"}``), which the
SDK's client raises as ``MCPError``. The admitted principal rides in the ASGI scope to the
tool handlers, which apply the same rule again.
"""
from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.datastructures import Headers
from starlette.types import Message, Receive, Scope, Send

from memlib.io.validate import validate_tenant_id
from memlib.serve.auth import Principal, Role
from memlib.serve.errors import ApiError, ErrorCode
from memlib.serve.mcp_tools import build_server
from memlib.serve.requests import body_timeout
from memlib.serve.service import SearchService

PRINCIPAL_KEY = "memlib.principal"
UNAUTHENTICATED = -32001  # JSON-RPC server error codes of this service
FORBIDDEN = -32003
PAYLOAD_TOO_LARGE = -32004
UNAVAILABLE = -32005
BODY_TIMEOUT = -32006
_NOBODY = Principal(Role.TENANT, None)  # may query nothing


def principal_from_request(ctx: ServerRequestContext) -> Principal:
    """The principal the gate admitted for this HTTP request (nobody if it is missing)."""
    request = ctx.request
    scope = getattr(request, "scope", None) or {}
    return scope.get(PRINCIPAL_KEY, _NOBODY)


def _decode(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except (UnicodeDecodeError, ValueError, RecursionError):  # ValueError: bad JSON, 4300+ digit numbers
        return None  # the SDK answers the parse error


def called_tenant(message: Any) -> str | None:
    """The ``tenant`` argument of a ``tools/call`` request, when it is a well-formed tenant id."""
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    params = message.get("params")
    args = params.get("arguments") if isinstance(params, dict) else None
    tenant = args.get("tenant") if isinstance(args, dict) else None
    if isinstance(tenant, str) and validate_tenant_id(tenant) is None:
        return tenant
    return None  # absent or malformed: the tool answers that


async def _read_body(receive: Receive, limit: int) -> tuple[bytes, bool]:
    """The request body (at most ``limit`` bytes) and whether it was larger."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return b"", True
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _reject(status: int, code: int, error: str, reason: str, request_id: Any, send: Send) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": request_id,
                       "error": {"code": code, "message": f"{error}: {reason}",
                                 "data": {"error": error, "reason": reason}}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="memlib"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class McpHttp:
    """ASGI app of ``/mcp``: the auth gate in front of the SDK's streamable HTTP handler."""

    def __init__(self, service: SearchService):
        self.service = service
        self.server = build_server(service, principal_from_request)
        self._inner: StreamableHTTPASGIApp | None = None

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Run for the app's lifetime: the SDK's session manager (its task group serves
        handshake-era requests). A manager runs once, so each lifespan gets a new one."""
        manager = StreamableHTTPSessionManager(app=self.server, json_response=True, stateless=True,
                                               max_request_body_size=self.service.limits.max_body_bytes)
        async with manager.run():
            self._inner = StreamableHTTPASGIApp(manager)
            try:
                yield
            finally:
                self._inner = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        inner = self._inner
        if inner is None:
            await _reject(503, UNAVAILABLE, "unavailable", "the MCP server is not running (app lifespan not started)",
                          None, send)
            return
        try:  # the token first: an unauthenticated client is answered before it sends a byte of body
            principal = self.service.auth.authenticate(Headers(scope=scope).get("authorization"))
        except ApiError as exc:
            self.service.metrics.observe("mcp", exc.status)
            await _reject(exc.status, UNAUTHENTICATED, exc.code.value, exc.reason, None, send)
            return
        body = b""
        if scope["method"] == "POST":
            timeout_s = self.service.limits.body_timeout_s
            try:
                async with asyncio.timeout(timeout_s):
                    body, too_large = await _read_body(receive, self.service.limits.max_body_bytes)
            except TimeoutError:
                exc = body_timeout(timeout_s)
                self.service.metrics.observe("mcp", exc.status)
                await _reject(exc.status, BODY_TIMEOUT, exc.code.value, exc.reason, None, send)
                return
            if too_large:
                self.service.metrics.observe("mcp", 413)
                await _reject(413, PAYLOAD_TOO_LARGE, ErrorCode.BODY_TOO_LARGE.value,
                              f"body exceeds serve.max_body_bytes={self.service.limits.max_body_bytes}", None, send)
                return
        message = _decode(body)
        request_id = message.get("id") if isinstance(message, dict) else None
        try:
            tenant = called_tenant(message)
            if tenant is not None:
                self.service.auth.authorize(principal, tenant)
        except ApiError as exc:
            self.service.metrics.observe("mcp", exc.status)
            await _reject(exc.status, FORBIDDEN, exc.code.value, exc.reason, request_id, send)
            return
        await inner({**scope, PRINCIPAL_KEY: principal}, _replay(body, receive), self._counting(send))

    def _counting(self, send: Send) -> Send:
        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.service.metrics.observe("mcp", message["status"])
            await send(message)

        return counted
