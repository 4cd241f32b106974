"""Bearer-token authentication: `Authorization: Bearer <token>` -> the token's tenant (401 otherwise).

The API docs (/docs, its assets, /openapi.json) also take HTTP Basic with the token as the password:
a browser cannot send a bearer header when it navigates, but it prompts on a Basic challenge and then
sends the same credentials with the page's fetch of /openapi.json. Every path ends in
`TenantDirectory.caller_of`, which compares tokens in constant time.

Three kinds of caller (service/role_tokens.py): a tenant (data routes, its own stats), the admin
(global stats, per-tenant metrics, the cluster event stream) and a metrics scraper (/metrics
only). Without tenants configured every request is the anonymous tenant, which is also admin:
the daemon then trusts whoever can reach its loopback port or unix socket.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Awaitable, Callable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.errors import AuthError, DocsAuthError, ForbiddenError
from service.tenants import Caller, Tenant, TenantDirectory

logger = logging.getLogger(__name__)

bearer_scheme = HTTPBearer(auto_error=False, description="A tenant token from the daemon's [service.tenants] config")
_MISSING = "missing bearer token; send 'Authorization: Bearer <token>'"
_NOT_BEARER = "the Authorization header is not a bearer token; send 'Authorization: Bearer <token>'"


def resolve_caller(directory: TenantDirectory, request: Request,
                   credentials: HTTPAuthorizationCredentials | None) -> Caller:
    """The caller a request's token names. Raises AuthError (401) for a missing or unknown token."""
    if not directory.auth_enabled:
        return _anonymous(directory)
    if credentials is None:
        raise AuthError(_NOT_BEARER if "authorization" in request.headers else _MISSING)
    caller = directory.caller_of(credentials.credentials)
    if caller is None:
        raise AuthError("unknown bearer token; use a token from the daemon's [service.tenants] config")
    return caller


def _anonymous(directory: TenantDirectory) -> Caller:
    assert directory.anonymous is not None
    return Caller(directory.anonymous, admin=True, metrics=True)


def docs_token(authorization: str) -> str | None:
    """The token in `Bearer <token>` or in Basic credentials `<any user>:<token>`; None otherwise."""
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    _, colon, password = decoded.partition(":")
    return password if colon and password else None


def resolve_docs_caller(directory: TenantDirectory, authorization: str) -> Caller:
    """The caller of a docs request: any valid token (tenant, admin or metrics scraper; the schema holds
    no tenant data), as Bearer or as the Basic password. Raises DocsAuthError (401 with a Basic challenge)."""
    if not directory.auth_enabled:
        return _anonymous(directory)
    token = docs_token(authorization)
    caller = None if token is None else directory.caller_of(token)
    if caller is None:
        raise DocsAuthError("the API docs need a token: open them with the token as the Basic password "
                            "(curl -u \":$TOKEN\"; a browser prompts) or send 'Authorization: Bearer <token>'"
                            if token is None else "unknown token; use a token from the daemon's config")
    return caller


def docs_dependency(directory: TenantDirectory) -> Callable[..., Awaitable[Caller]]:
    """A FastAPI dependency for /docs, its assets and /openapi.json (Bearer or Basic, see the module doc)."""

    async def docs_caller(request: Request) -> Caller:
        return resolve_docs_caller(directory, request.headers.get("authorization", ""))

    return docs_caller


def tenant_dependency(directory: TenantDirectory) -> Callable[..., Awaitable[Tenant]]:
    """A FastAPI dependency resolving the request's tenant; documented in OpenAPI as bearer auth."""

    async def current_tenant(request: Request,
                             credentials: HTTPAuthorizationCredentials | None = Depends(bearer_scheme)) -> Tenant:
        caller = resolve_caller(directory, request, credentials)
        if caller.tenant is None:
            raise ForbiddenError("this token is the admin's or the metrics scraper's; the data routes need a "
                                 "tenant's token from [[service.tenants]]")
        return caller.tenant

    return current_tenant


def caller_dependency(directory: TenantDirectory) -> Callable[..., Awaitable[Caller]]:
    """A FastAPI dependency resolving any authenticated caller (tenant, admin or metrics scraper)."""

    async def current_caller(request: Request,
                             credentials: HTTPAuthorizationCredentials | None = Depends(bearer_scheme)) -> Caller:
        return resolve_caller(directory, request, credentials)

    return current_caller


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
