"""The FastAPI application over a :class:`SearchService` (Ray Serve wraps it in jobs/serve.py;
tests drive it directly): the JSON API under ``/v1``, the MCP server at ``/mcp``
(:mod:`memlib.serve.mcp_http`) and the memory explorer page at ``/ui`` (static files shipped
in ``memlib/serve/ui``)."""
from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from memlib.serve.errors import ApiError, ErrorCode
from memlib.serve.explore import MAX_DEPTH, MAX_GRAPH_NODES, MAX_WINDOW
from memlib.serve.mcp_http import McpHttp
from memlib.serve.models import (
    ErrorResponse,
    HealthResponse,
    NodeGraphResponse,
    ReloadResponse,
    SearchRequest,
    SearchResponse,
    SessionResponse,
    TenantsResponse,
)
from memlib.serve.requests import check_body_size, read_body
from memlib.serve.service import SearchService

UI_DIR = Path(__file__).resolve().parent / "ui"
log = logging.getLogger("memlib.serve")
ERRORS = {s: {"model": ErrorResponse} for s in (401, 403, 404, 422, 500, 503)}
SEARCH_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": SearchRequest.model_json_schema()}}}}


def _json(model) -> Response:
    return Response(content=model.model_dump_json(), media_type="application/json")


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(status_code=exc.status, content=exc.to_dict())


async def _measured(service: SearchService, endpoint: str, call: Callable[[], Awaitable[Response]],
                    strategy: Callable[[], str | None] = lambda: None) -> Response:
    t0 = time.perf_counter()
    try:
        resp = await call()
    except ApiError as exc:
        service.metrics.observe(endpoint, exc.status, strategy())
        return _error(exc)
    except Exception as exc:  # noqa: BLE001 - any other failure is still one counted JSON answer
        log.exception("%s failed", endpoint)
        err = ApiError(ErrorCode.INTERNAL, f"{type(exc).__name__} while handling the request")
        service.metrics.observe(endpoint, err.status, strategy())
        return _error(err)
    service.metrics.observe(endpoint, resp.status_code, strategy(), time.perf_counter() - t0)
    return resp


def build_app(service: SearchService) -> FastAPI:
    mcp = McpHttp(service)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with mcp.lifespan():
            yield

    docs = service.cfg.serve.api_docs  # Swagger UI and ReDoc load their scripts from a CDN: off unless asked for
    app = FastAPI(title="memlib retrieval service", version="1", lifespan=lifespan,
                  docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None,
                  description="Multi-tenant retrieval over a memlib memory store. Bearer tokens per tenant; "
                              "the admin token may query every tenant. The same tokens open the MCP server "
                              "(`/mcp`) and the memory explorer page (`/ui`).")

    @app.post("/v1/search", response_model=SearchResponse, responses=ERRORS, openapi_extra=SEARCH_BODY,
              summary="Retrieve ranked memory nodes with provenance and a packed context")
    async def search(request: Request) -> Response:
        seen: dict[str, str | None] = {"strategy": None}

        async def call() -> Response:
            # the token first: an unauthenticated client is answered before it sends a byte of body
            principal = service.auth.authenticate(request.headers.get("authorization"))
            check_body_size(request.headers.get("content-length"), service.limits.max_body_bytes)
            raw = await read_body(request.stream(), service.limits.max_body_bytes, service.limits.body_timeout_s)
            _, req = service.parse(request.headers.get("authorization"), raw, principal)
            seen["strategy"] = req.strategy
            return _json(await run_in_threadpool(service.search, req))

        return await _measured(service, "search", call, lambda: seen["strategy"])

    @app.get("/v1/tenants", response_model=TenantsResponse, responses=ERRORS, summary="Tenants this token may query")
    async def tenants(request: Request) -> Response:
        async def call() -> Response:
            return _json(service.tenants(request.headers.get("authorization")))

        return await _measured(service, "tenants", call)

    app.head("/v1/tenants", include_in_schema=False)(tenants)  # the server sends the GET's headers alone

    @app.post("/v1/reload", response_model=ReloadResponse, responses=ERRORS,
              summary="Admin: switch to the newest published store version")
    async def reload(request: Request) -> Response:
        async def call() -> Response:
            return _json(await run_in_threadpool(service.reload, request.headers.get("authorization")))

        return await _measured(service, "reload", call)

    _explorer_routes(app, service)
    _mount_mcp_and_ui(app, mcp)

    @app.get("/healthz", response_model=HealthResponse, summary="Liveness and the store version served (the "
             "reasons of broken tenants name their files only for the admin token)")
    async def healthz(request: Request) -> Response:
        return _json(service.health(request.headers.get("authorization")))

    app.head("/healthz", include_in_schema=False)(healthz)

    @app.get("/metrics", summary="Prometheus metrics of this replica", response_class=Response)
    async def metrics() -> Response:
        return Response(content=service.metrics.render(), media_type=service.metrics.content_type)

    _document_extra_paths(app)
    return app


def _explorer_routes(app: FastAPI, service: SearchService) -> None:
    """Small read endpoints of the explorer page (and of any client): a session's turns and the
    graph around a node. Authenticated and tenant-scoped like ``/v1/search``."""

    @app.exception_handler(RequestValidationError)
    async def bad_query(_: Request, exc: RequestValidationError) -> JSONResponse:
        reason = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ())[1:])}: {e.get('msg')}"
                           for e in exc.errors()[:5])
        return _error(ApiError(ErrorCode.BAD_ARGUMENT, reason))

    @app.get("/v1/session", response_model=SessionResponse, responses=ERRORS,
             summary="The turns of one session (or a window around one of its turns)")
    async def session(request: Request, tenant: str = Query(..., description="tenant id"),
                      session_id: str = Query(..., description="session id, as in a search hit"),
                      around: str | None = Query(None, description="turn id (e.g. D1:3) or turn node id"),
                      window: int = Query(5, ge=0, le=MAX_WINDOW, description="turns either side of `around`"),
                      ) -> Response:
        async def call() -> Response:
            principal = service.auth.authenticate(request.headers.get("authorization"))
            return _json(await run_in_threadpool(service.session, principal, tenant, session_id, around, window))

        return await _measured(service, "session", call)

    @app.get("/v1/graph", response_model=NodeGraphResponse, responses=ERRORS,
             summary="The nodes derived from a node (facts, entities, events, concepts) and the edges among them")
    async def graph(request: Request, tenant: str = Query(..., description="tenant id"),
                    node: str = Query(..., description="node id, or a turn id such as D1:3"),
                    depth: int = Query(2, ge=1, le=MAX_DEPTH, description="hops from the node"),
                    limit: int = Query(40, ge=1, le=MAX_GRAPH_NODES, description="at most this many nodes"),
                    structural: bool = Query(False, description="also NEXT, IN_SEGMENT, IN_SESSION, SIMILAR, "
                                                                "HAS_CLUE edges"),
                    ) -> Response:
        async def call() -> Response:
            principal = service.auth.authenticate(request.headers.get("authorization"))
            return _json(await run_in_threadpool(service.node_graph, principal, tenant, node, depth, limit,
                                                 structural))

        return await _measured(service, "graph", call)


def _mount_mcp_and_ui(app: FastAPI, mcp: McpHttp) -> None:
    # routes, not a mount: a mount would answer "/mcp" with a redirect, one more round trip per call
    app.router.routes.append(Route("/mcp", endpoint=mcp))
    app.router.routes.append(Route("/mcp/", endpoint=mcp))

    @app.get("/ui", include_in_schema=False)
    async def ui_root() -> Response:
        return RedirectResponse("/ui/", headers=UI_HEADERS)

    app.mount("/ui", _UiFiles(directory=UI_DIR, html=True), name="ui")


# the explorer page runs only its own script and style, talks only to this origin and is never framed
UI_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class _UiFiles(StaticFiles):
    async def get_response(self, path: str, scope) -> Response:
        resp = await super().get_response(path, scope)
        resp.headers.update(UI_HEADERS)
        return resp


EXTRA_PATHS = {
    "/mcp": {"post": {
        "summary": "MCP server (streamable HTTP, stateless, JSON answers)",
        "description": "Model Context Protocol endpoint: one JSON-RPC 2.0 request per POST (tools search_memory, "
                       "list_tenants, get_session). Bearer token as for /v1/search: none or unknown -> 401, a "
                       "tools/call naming a tenant the token may not query -> 403, both with a JSON-RPC error body.",
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}},
        "responses": {"200": {"description": "JSON-RPC response"}, "401": {"description": "unauthenticated"},
                      "403": {"description": "forbidden tenant"}}}},
    "/ui/": {"get": {"summary": "Memory explorer page (static HTML; paste a token to use it)",
                     "responses": {"200": {"description": "HTML page", "content": {"text/html": {}}}}}},
}


def _document_extra_paths(app: FastAPI) -> None:
    """Add the non-FastAPI routes (/mcp, /ui/) to the generated OpenAPI document."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            generate()["paths"].update(EXTRA_PATHS)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
