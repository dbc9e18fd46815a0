"""Typed service errors: each carries its HTTP status and a machine-readable code."""
from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    UNAUTHENTICATED = "unauthenticated"      # 401: no or unknown bearer token
    FORBIDDEN = "forbidden"                  # 403: token of another tenant, or not admin
    UNKNOWN_TENANT = "unknown_tenant"        # 404: tenant not in the published store
    UNKNOWN_SESSION = "unknown_session"      # 404: no such session in the tenant
    UNKNOWN_NODE = "unknown_node"            # 404: no such node (or turn id) in the tenant
    BODY_TOO_LARGE = "body_too_large"        # 422: body above serve.max_body_bytes
    BODY_TIMEOUT = "body_timeout"            # 408: body not received within serve.body_timeout_s
    MALFORMED_BODY = "malformed_body"        # 422: not JSON / not an object / wrong fields
    BAD_TENANT_ID = "bad_tenant_id"          # 422: fails TENANT_ID_RE (path tricks)
    UNKNOWN_STRATEGY = "unknown_strategy"    # 422: not in the retrieval registry
    BAD_K = "bad_k"                          # 422: k outside 1..serve.max_k
    BAD_ARGUMENT = "bad_argument"            # 422: another parameter out of range or of the wrong type
    SEARCH_FAILED = "search_failed"          # 500: the strategy raised
    TENANT_UNAVAILABLE = "tenant_unavailable"  # 503: the tenant's files cannot be loaded (others are served)
    INTERNAL = "internal_error"              # 500: anything else that went wrong handling the request


STATUS = {
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.UNKNOWN_TENANT: 404,
    ErrorCode.UNKNOWN_SESSION: 404,
    ErrorCode.UNKNOWN_NODE: 404,
    ErrorCode.BODY_TOO_LARGE: 422,
    ErrorCode.BODY_TIMEOUT: 408,
    ErrorCode.MALFORMED_BODY: 422,
    ErrorCode.BAD_TENANT_ID: 422,
    ErrorCode.UNKNOWN_STRATEGY: 422,
    ErrorCode.BAD_K: 422,
    ErrorCode.BAD_ARGUMENT: 422,
    ErrorCode.SEARCH_FAILED: 500,
    ErrorCode.TENANT_UNAVAILABLE: 503,
    ErrorCode.INTERNAL: 500,
}


class ApiError(Exception):
    """An error answered to the caller as ``{"error": code, "reason": text}``."""

    def __init__(self, code: ErrorCode, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason

    @property
    def status(self) -> int:
        return STATUS[self.code]

    def to_dict(self) -> dict[str, str]:
        return {"error": self.code.value, "reason": self.reason}
