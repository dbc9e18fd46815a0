"""The FastAPI application over a :class:`SearchService` (Ray Serve wraps it in jobs/serve.py;
tests drive it directly)."""
from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from memlib.serve.errors import ApiError, ErrorCode
from memlib.serve.models import (ErrorResponse, HealthResponse, ReloadResponse, SearchRequest, SearchResponse,
                                 TenantsResponse)
from memlib.serve.requests import check_body_size, read_body
from memlib.serve.service import SearchService

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
    app = FastAPI(title="memlib retrieval service", version="1",
                  description="Multi-tenant retrieval over a memlib memory store. Bearer tokens per tenant; "
                              "the admin token may query every tenant.")

    @app.post("/v1/search", response_model=SearchResponse, responses=ERRORS, openapi_extra=SEARCH_BODY,
              summary="Retrieve ranked memory nodes with provenance and a packed context")
    async def search(request: Request) -> Response:
        seen: dict[str, str | None] = {"strategy": None}

        async def call() -> Response:
            check_body_size(request.headers.get("content-length"), service.limits.max_body_bytes)
            raw = await read_body(request.stream(), service.limits.max_body_bytes)
            _, req = service.parse(request.headers.get("authorization"), raw)
            seen["strategy"] = req.strategy
            return _json(await run_in_threadpool(service.search, req))

        return await _measured(service, "search", call, lambda: seen["strategy"])

    @app.get("/v1/tenants", response_model=TenantsResponse, responses=ERRORS, summary="Tenants this token may query")
    async def tenants(request: Request) -> Response:
        async def call() -> Response:
            return _json(service.tenants(request.headers.get("authorization")))

        return await _measured(service, "tenants", call)

    @app.post("/v1/reload", response_model=ReloadResponse, responses=ERRORS,
              summary="Admin: switch to the newest published store version")
    async def reload(request: Request) -> Response:
        async def call() -> Response:
            return _json(await run_in_threadpool(service.reload, request.headers.get("authorization")))

        return await _measured(service, "reload", call)

    @app.get("/healthz", response_model=HealthResponse, summary="Liveness and the store version served")
    async def healthz() -> Response:
        return _json(service.health())

    @app.get("/metrics", summary="Prometheus metrics of this replica", response_class=Response)
    async def metrics() -> Response:
        return Response(content=service.metrics.render(), media_type=service.metrics.content_type)

    return app
