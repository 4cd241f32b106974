"""Bearer-token authentication: `Authorization: Bearer <token>` -> the token's tenant (401 otherwise)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.errors import AuthError
from service.tenants import Tenant, TenantDirectory

logger = logging.getLogger(__name__)

_bearer = HTTPBearer(auto_error=False, description="A tenant token from the daemon's [service.tenants] config")


def tenant_dependency(directory: TenantDirectory) -> Callable[..., Awaitable[Tenant]]:
    """A FastAPI dependency resolving the request's tenant; documented in OpenAPI as bearer auth."""

    async def current_tenant(request: Request,
                             credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Tenant:
        if not directory.auth_enabled:
            assert directory.anonymous is not None
            return directory.anonymous
        if credentials is None:
            has_header = "authorization" in request.headers
            raise AuthError("the Authorization header is not a bearer token; send 'Authorization: Bearer <token>'"
                            if has_header else "missing bearer token; send 'Authorization: Bearer <token>'")
        tenant = directory.by_token(credentials.credentials)
        if tenant is None:
            raise AuthError("unknown bearer token; use a token from the daemon's [service.tenants] config")
        return tenant

    return current_tenant


def tenant_of_header(directory: TenantDirectory, authorization: str) -> Tenant | None:
    """The tenant an Authorization header value names (the anonymous one without auth), else None.
    For paths outside FastAPI's dependencies (service/fast_lookup.py); None means: let the route
    answer, with its 401 and message."""
    if not directory.auth_enabled:
        return directory.anonymous
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return directory.by_token(token.strip())
