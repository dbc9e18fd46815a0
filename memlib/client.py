"""A small typed client for the memlib retrieval service, for agent code.

    from memlib.client import MemlibClient
    with MemlibClient("http://127.0.0.1:8000", token) as c:
        resp = c.search("alice", "where did I go hiking?", strategy="auto", k=10)
        for node in resp.results: print(node.score, node.turn_ids, node.text)

HTTP errors become typed exceptions: 401 :class:`AuthenticationError`, 403
:class:`PermissionDeniedError`, 404 :class:`TenantNotFoundError`, 422
:class:`InvalidRequestError`, anything else :class:`ServiceError`.
"""
from __future__ import annotations

from typing import Any

import httpx

from memlib.serve.models import HealthResponse, ReloadResponse, SearchResponse, TenantsResponse


class MemlibError(Exception):
    """Base of every client error; ``status`` is the HTTP status, ``code`` the service's error code."""

    def __init__(self, status: int, code: str, reason: str):
        super().__init__(f"{status} {code}: {reason}")
        self.status = status
        self.code = code
        self.reason = reason


class AuthenticationError(MemlibError):
    pass


class PermissionDeniedError(MemlibError):
    pass


class TenantNotFoundError(MemlibError):
    pass


class InvalidRequestError(MemlibError):
    pass


class ServiceError(MemlibError):
    pass


_BY_STATUS: dict[int, type[MemlibError]] = {401: AuthenticationError, 403: PermissionDeniedError,
                                             404: TenantNotFoundError, 422: InvalidRequestError}


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    code = str(body.get("error", "http_error"))
    reason = str(body.get("reason") or body.get("detail") or resp.text[:300])
    raise _BY_STATUS.get(resp.status_code, ServiceError)(resp.status_code, code, reason)


class MemlibClient:
    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout,
                                  transport=transport)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self._http.request(method, path, **kwargs)
        _raise_for(resp)
        return resp.json()

    def search(self, tenant: str, query: str, strategy: str = "auto", k: int = 10,
               question_time: str | None = None) -> SearchResponse:
        """``question_time``: ISO 8601 time the question is asked at (relative dates resolve against it)."""
        body = {"tenant": tenant, "query": query, "strategy": strategy, "k": k}
        if question_time is not None:
            body["question_time"] = question_time
        return SearchResponse.model_validate(self._call("POST", "/v1/search", json=body))

    def tenants(self) -> list[str]:
        return TenantsResponse.model_validate(self._call("GET", "/v1/tenants")).tenants

    def health(self) -> HealthResponse:
        return HealthResponse.model_validate(self._call("GET", "/healthz"))

    def reload(self) -> ReloadResponse:
        """Admin token only: switch the replica to the newest published store version."""
        return ReloadResponse.model_validate(self._call("POST", "/v1/reload"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "MemlibClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
