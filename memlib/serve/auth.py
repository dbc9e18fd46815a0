"""Bearer-token auth. The config holds only sha256 hex digests of tokens: one per tenant
(``serve.tenant_token_hashes``) and one admin digest that may query every tenant.

A presented token is hashed and the digest looked up, so lookup timing depends on the
digest, never on the secret itself; the admin digest is compared in constant time."""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from enum import Enum
from typing import Mapping

from memlib.io.validate import validate_tenant_id
from memlib.serve.errors import ApiError, ErrorCode

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_BEARER = re.compile(r"^\s*Bearer\s+(\S+)\s*$", re.IGNORECASE)


def hash_token(token: str) -> str:
    """The sha256 hex digest stored in the config for ``token``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token(nbytes: int = 32) -> str:
    """A fresh random URL-safe token."""
    return secrets.token_urlsafe(nbytes)


class Role(str, Enum):
    ADMIN = "admin"
    TENANT = "tenant"
    OPEN = "open"  # auth disabled: everything allowed


@dataclass(frozen=True)
class Principal:
    role: Role
    tenant: str | None = None
    bound_by: str | None = None  # what scoped it to its tenant when no token did (memlib mcp --tenant)

    def may_access(self, tenant: str) -> bool:
        return self.role in (Role.ADMIN, Role.OPEN) or self.tenant == tenant

    @property
    def is_admin(self) -> bool:
        return self.role in (Role.ADMIN, Role.OPEN)


class AuthConfigError(ValueError):
    pass


def _check_digest(what: str, digest: str) -> str:
    digest = digest.strip().lower()
    if not _HEX64.match(digest):
        raise AuthConfigError(f"{what}: expected a sha256 hex digest (64 hex chars), not a plaintext token; "
                              "use `memlib serve hash-token` to produce one")
    return digest


class Authorizer:
    """Maps an ``Authorization`` header to a :class:`Principal` (or raises 401/403)."""

    def __init__(self, tenant_token_hashes: Mapping[str, str], admin_token_hash: str | None, enabled: bool = True):
        self.enabled = enabled
        self._by_digest: dict[str, str] = {}
        for tenant, digest in tenant_token_hashes.items():
            reason = validate_tenant_id(tenant)
            if reason:
                raise AuthConfigError(f"serve.tenant_token_hashes: {reason}")
            d = _check_digest(f"serve.tenant_token_hashes[{tenant!r}]", digest)
            if d in self._by_digest:
                raise AuthConfigError(f"tenants {self._by_digest[d]!r} and {tenant!r} share one token")
            self._by_digest[d] = tenant
        self._admin = _check_digest("serve.admin_token_hash", admin_token_hash) if admin_token_hash else None
        if self._admin is not None and self._admin in self._by_digest:
            raise AuthConfigError("the admin token must differ from every tenant token")

    @classmethod
    def from_config(cls, serve_cfg) -> "Authorizer":
        return cls(serve_cfg.tenant_token_hashes, serve_cfg.admin_token_hash, serve_cfg.auth_enabled)

    def authenticate(self, header: str | None) -> Principal:
        if not self.enabled:
            return Principal(Role.OPEN)
        if not header:
            raise ApiError(ErrorCode.UNAUTHENTICATED, "missing 'Authorization: Bearer <token>' header")
        m = _BEARER.match(header)
        if m is None:
            raise ApiError(ErrorCode.UNAUTHENTICATED, "the Authorization header must be 'Bearer <token>'")
        digest = hash_token(m.group(1))
        if self._admin is not None and hmac.compare_digest(digest, self._admin):
            return Principal(Role.ADMIN)
        tenant = self._by_digest.get(digest)
        if tenant is None:
            raise ApiError(ErrorCode.UNAUTHENTICATED, "unknown bearer token")
        return Principal(Role.TENANT, tenant)

    @staticmethod
    def authorize(principal: Principal, tenant: str) -> None:
        if not principal.may_access(tenant):
            if principal.bound_by:
                raise ApiError(ErrorCode.FORBIDDEN, f"this connection is bound to tenant {principal.tenant!r} "
                                                    f"({principal.bound_by}); it may not query tenant {tenant!r}")
            raise ApiError(ErrorCode.FORBIDDEN, f"this token may not query tenant {tenant!r}")

    @staticmethod
    def require_admin(principal: Principal) -> None:
        if not principal.is_admin:
            raise ApiError(ErrorCode.FORBIDDEN, "this endpoint needs the admin token")
