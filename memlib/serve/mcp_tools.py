"""The retrieval service as an MCP server (official ``mcp`` SDK, low-level ``Server``).

Three read-only tools over a :class:`~memlib.serve.service.SearchService`:

* ``search_memory(query, tenant?, k?, strategy?)``: the ranked turns with session times and
  provenance, as text an agent pastes into its context, and the whole ``/v1/search`` answer as
  structured content. Arguments go through the same validation, authorization and search
  call as a ``/v1/search`` body (:meth:`SearchService.search_request`, :meth:`SearchService.search`).
* ``list_tenants()``: the tenants the caller may query.
* ``get_session(session_id, tenant?, around?, window?)``: the turns of one session, for the
  context around a hit.

``tenant`` may be left out when the caller reaches exactly one tenant (a tenant token, or
``memlib mcp --tenant T``). Bad arguments, unknown tenants or sessions and refused tenants are
answered as tool errors (``isError``, text ``code: reason``), so the calling model reads the
reason; an unknown tool name is a JSON-RPC error.
"""
from __future__ import annotations

import logging
from enum import Enum
from typing import Any, Awaitable, Callable

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memlib.serve.auth import Principal, Role
from memlib.serve.errors import ApiError, ErrorCode
from memlib.serve.explore import MAX_WINDOW
from memlib.serve.mcp_text import pack_search, pack_session, pack_tenants
from memlib.serve.models import MAX_QUERY_CHARS, QUESTION_TIME_DOC, SessionResponse, TenantsResponse
from memlib.serve.service import SearchService

log = logging.getLogger("memlib.serve")
SERVER_NAME = "memlib"
PrincipalOf = Callable[[ServerRequestContext], Principal]


class ToolName(str, Enum):
    SEARCH = "search_memory"
    TENANTS = "list_tenants"
    SESSION = "get_session"


class SessionArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str
    session_id: str = Field(..., min_length=1)
    around: str | None = None
    window: int = Field(5, ge=0, le=MAX_WINDOW)


_READ_ONLY = types.ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                                   open_world_hint=False)
_TENANT = {"type": "string", "description": "tenant id; may be left out when the token reaches one tenant"}


def tool_list(service: SearchService) -> list[types.Tool]:
    limits = service.limits
    search = {"type": "object", "additionalProperties": False, "required": ["query"], "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS, "description": "the question"},
        "tenant": _TENANT,
        "k": {"type": "integer", "minimum": 1, "maximum": limits.max_k,
              "description": f"result nodes to retrieve (default {limits.default_k})"},
        "strategy": {"type": "string", "enum": sorted(service.strategy_names),
                     "description": f"retrieval strategy (default {limits.default_strategy})"},
        "question_time": {"type": "string", "maxLength": 64, "description": QUESTION_TIME_DOC}}}
    session = {"type": "object", "additionalProperties": False, "required": ["session_id"], "properties": {
        "session_id": {"type": "string", "description": "a session id from a search_memory hit"},
        "tenant": _TENANT,
        "around": {"type": "string", "description": "a turn id (e.g. D1:3): return only the turns near it"},
        "window": {"type": "integer", "minimum": 0, "maximum": MAX_WINDOW,
                   "description": "turns either side of `around` (default 5)"}}}
    return [
        # no output schema here: a client validates every structured result against it (the SDK's
        # client with jsonschema: ~2 ms of client CPU per 10-hit answer, measured with memlib bench
        # serve); the structured content is the /v1/search answer, documented in the OpenAPI
        types.Tool(name=ToolName.SEARCH.value, title="Search long-term memory", input_schema=search,
                   annotations=_READ_ONLY,
                   description="Search a tenant's long-term conversational memory. Returns the ranked source "
                               "turns with their session dates, turn ids and the memory node that found them."),
        types.Tool(name=ToolName.TENANTS.value, title="List memory tenants", annotations=_READ_ONLY,
                   input_schema={"type": "object", "additionalProperties": False, "properties": {}},
                   output_schema=TenantsResponse.model_json_schema(),
                   description="The tenants (users, teams) whose memory this connection may search."),
        types.Tool(name=ToolName.SESSION.value, title="Read a conversation session", input_schema=session,
                   output_schema=SessionResponse.model_json_schema(), annotations=_READ_ONLY,
                   description="The turns of one session of a tenant's conversations, in order; with `around`, "
                               "only the turns near one turn (context around a search hit)."),
    ]


def _with_tenant(principal: Principal, args: dict[str, Any]) -> dict[str, Any]:
    if "tenant" in args or principal.role is not Role.TENANT:
        return args
    return {**args, "tenant": principal.tenant}


async def _search(service: SearchService, principal: Principal, args: dict[str, Any]) -> types.CallToolResult:
    req = service.search_request(principal, _with_tenant(principal, args))
    resp = await anyio.to_thread.run_sync(service.search, req)
    return types.CallToolResult(content=[types.TextContent(text=pack_search(resp))],
                                structured_content=resp.model_dump(mode="json"))


async def _tenants(service: SearchService, principal: Principal, args: dict[str, Any]) -> types.CallToolResult:
    if args:
        raise ApiError(ErrorCode.BAD_ARGUMENT, f"list_tenants takes no arguments, got {sorted(args)}")
    resp = service.visible_tenants(principal)
    return types.CallToolResult(content=[types.TextContent(text=pack_tenants(resp))],
                                structured_content=resp.model_dump(mode="json"))


async def _session(service: SearchService, principal: Principal, args: dict[str, Any]) -> types.CallToolResult:
    try:
        a = SessionArgs.model_validate(_with_tenant(principal, args), strict=True)
    except ValidationError as exc:
        raise ApiError(ErrorCode.BAD_ARGUMENT, "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()[:5])) from None
    resp = await anyio.to_thread.run_sync(service.session, principal, a.tenant, a.session_id, a.around, a.window)
    return types.CallToolResult(content=[types.TextContent(text=pack_session(resp))],
                                structured_content=resp.model_dump(mode="json"))


Handler = Callable[[SearchService, Principal, dict[str, Any]], Awaitable[types.CallToolResult]]
HANDLERS: dict[str, Handler] = {ToolName.SEARCH.value: _search, ToolName.TENANTS.value: _tenants,
                                ToolName.SESSION.value: _session}


def tool_error(code: str, reason: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=f"{code}: {reason}")], is_error=True,
                                structured_content={"error": code, "reason": reason})


async def call_tool(service: SearchService, principal: Principal, name: str,
                    args: dict[str, Any]) -> types.CallToolResult:
    """Run tool ``name`` for ``principal``; service errors become tool errors, metered like HTTP calls."""
    handler = HANDLERS.get(name)
    if handler is None:
        raise MCPError(types.INVALID_PARAMS, f"unknown tool {name!r}; known: {', '.join(HANDLERS)}")
    strategy = args.get("strategy") if name == ToolName.SEARCH.value else None
    known = strategy if isinstance(strategy, str) and strategy in service.strategy_names else None  # bounded labels
    try:
        result = await handler(service, principal, args)
    except ApiError as exc:
        service.metrics.observe(f"mcp_{name}", exc.status, known)
        return tool_error(exc.code.value, exc.reason)
    except Exception as exc:  # one failing call must not end the connection
        log.exception("MCP tool %s failed", name)
        service.metrics.observe(f"mcp_{name}", 500)
        return tool_error(ErrorCode.SEARCH_FAILED.value, f"{type(exc).__name__}: {exc}")
    used = (result.structured_content or {}).get("strategy") if name == ToolName.SEARCH.value else None
    service.metrics.observe(f"mcp_{name}", 200, used)
    return result


def build_server(service: SearchService, principal_of: PrincipalOf) -> Server:
    """A low-level MCP ``Server`` over ``service``; ``principal_of`` names the caller of a request
    (the bearer token's principal over HTTP, a fixed one over stdio)."""
    tools = tool_list(service)
    listing = types.ListToolsResult(tools=tools)

    async def on_list_tools(ctx: ServerRequestContext, params: Any) -> types.ListToolsResult:
        return listing

    async def on_call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await call_tool(service, principal_of(ctx), params.name, dict(params.arguments or {}))

    schemas = {t.name: t.input_schema for t in tools}
    return Server(SERVER_NAME, version="1", title="memlib long-term memory",
                  instructions="Search the user's long-term conversational memory with search_memory; read the "
                               "session around a hit with get_session. Cite turn ids and session dates.",
                  get_tool_input_schema=schemas.get, on_list_tools=on_list_tools, on_call_tool=on_call_tool)
