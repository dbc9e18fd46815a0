"""Validation of a raw ``POST /v1/search`` body into a :class:`SearchRequest`, with one
typed reason per failure (422; 408 for a body that does not arrive within ``serve.body_timeout_s``)."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import AsyncIterator, Collection

from pydantic import ValidationError

from memlib.io.validate import validate_tenant_id
from memlib.serve.errors import ApiError, ErrorCode
from memlib.serve.models import SearchRequest


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int
    max_k: int
    default_k: int
    default_strategy: str
    body_timeout_s: float = 5.0


def check_body_size(content_length: str | None, limit: int) -> None:
    """Reject from the Content-Length header before reading the body, when present."""
    if content_length is None:
        return
    try:
        n = int(content_length)
    except ValueError:
        raise ApiError(ErrorCode.MALFORMED_BODY, "Content-Length is not an integer") from None
    if n > limit:
        raise ApiError(ErrorCode.BODY_TOO_LARGE, f"body of {n} bytes exceeds serve.max_body_bytes={limit}")


async def read_body(chunks: AsyncIterator[bytes], limit: int, timeout_s: float | None = None) -> bytes:
    """The request body, read chunk by chunk and refused as soon as it passes ``limit`` bytes
    (a chunked upload has no Content-Length to check first) or takes longer than ``timeout_s``
    (408: a client sending a byte now and then must not hold a request slot)."""
    parts, size = [], 0

    async def read() -> None:
        nonlocal size
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise ApiError(ErrorCode.BODY_TOO_LARGE, f"body of more than {limit} bytes exceeds "
                                                         f"serve.max_body_bytes={limit}")
            parts.append(chunk)

    try:
        async with asyncio.timeout(timeout_s):
            await read()
    except TimeoutError:
        raise body_timeout(timeout_s) from None
    return b"".join(parts)


def body_timeout(timeout_s: float | None) -> ApiError:
    return ApiError(ErrorCode.BODY_TIMEOUT, f"the request body did not arrive within serve.body_timeout_s={timeout_s}")


def check_tenant_id(tenant: str) -> str:
    reason = validate_tenant_id(tenant)
    if reason:
        raise ApiError(ErrorCode.BAD_TENANT_ID, reason)
    return tenant


def _pydantic_reason(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ())) or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def parse_search(raw: bytes, limits: Limits, strategies: Collection[str]) -> SearchRequest:
    """Bytes -> a complete SearchRequest (defaults filled) or :class:`ApiError` (422)."""
    if len(raw) > limits.max_body_bytes:
        raise ApiError(ErrorCode.BODY_TOO_LARGE,
                       f"body of {len(raw)} bytes exceeds serve.max_body_bytes={limits.max_body_bytes}")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(ErrorCode.MALFORMED_BODY, f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(ErrorCode.MALFORMED_BODY, "body is nested too deep") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ApiError(ErrorCode.MALFORMED_BODY, f"body is not decodable: {str(exc)[:120]}") from None
    if not isinstance(data, dict):
        raise ApiError(ErrorCode.MALFORMED_BODY, f"body must be a JSON object, got {type(data).__name__}")
    return validate_search(data, limits, strategies)


def validate_search(data: dict, limits: Limits, strategies: Collection[str]) -> SearchRequest:
    """A decoded request object (``/v1/search`` body, MCP ``search_memory`` arguments) -> a complete
    SearchRequest (defaults filled) or :class:`ApiError` (422)."""
    if isinstance(data.get("tenant"), str):
        check_tenant_id(data["tenant"])
    try:
        req = SearchRequest.model_validate(data, strict=True)
    except ValidationError as exc:
        raise ApiError(ErrorCode.MALFORMED_BODY, _pydantic_reason(exc)) from None
    check_tenant_id(req.tenant)
    if not req.query.strip():
        raise ApiError(ErrorCode.MALFORMED_BODY, "query: must not be blank")
    strategy = limits.default_strategy if req.strategy is None else req.strategy
    if strategy not in strategies:
        raise ApiError(ErrorCode.UNKNOWN_STRATEGY,
                       f"unknown strategy {strategy!r}; known: {', '.join(sorted(strategies))}")
    k = limits.default_k if req.k is None else req.k
    if not 1 <= k <= limits.max_k:
        raise ApiError(ErrorCode.BAD_K, f"k={k} is outside 1..{limits.max_k} (serve.max_k)")
    if req.question_time is not None:
        question_time(req.question_time)
    return req.model_copy(update={"strategy": strategy, "k": k})


def question_time(value: str) -> datetime:
    """A request's ``question_time`` as a datetime (one without a zone is UTC); :class:`ApiError`
    (422, ``bad_argument``) when it is not an ISO 8601 date or time."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ApiError(ErrorCode.BAD_ARGUMENT, f"question_time: {value[:64]!r} is not an ISO 8601 date or time "
                                               "(e.g. 2023-05-08 or 2023-05-08T13:56:00Z)") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
