"""The one place that maps errors to HTTP answers: bad input is always a 4xx with a clear message.

    KVStoreError subclass          status   why
    BadChunkError                  400      malformed key / body / token ids
    ConfigError, UnknownNameError  400      a request option names something invalid
    LayoutMismatchError            422      chunk size, dtype or layout fingerprint differ
    CorruptChunkError              404      a stored chunk failed its checksum: it is a miss
    TierFullError, Backpressure    429      no room right now (pinned or queued); retry later
    ServiceError subclasses        own      401 auth, 403 tenant, 404 missing, 413 too large, 429 quota or
                                            memory budget
    TierIOError                    503      a disk failed: the server's fault, not the request's
    NoNodeError                    503      no live cluster node to route to (the cluster's state)

Every body is {"error": <class name>, "detail": <message with the numbers and the fix>}.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvstore.errors import (
    BackpressureError,
    BadChunkError,
    ConfigError,
    CorruptChunkError,
    KVStoreError,
    LayoutMismatchError,
    NoNodeError,
    TierFullError,
    TierIOError,
)

logger = logging.getLogger(__name__)


class ServiceError(KVStoreError):
    """An error of the daemon itself; `status` is its HTTP code."""

    status = 400
    headers: dict[str, str] | None = None  # extra response headers (e.g. an auth challenge)


class BadRequestError(ServiceError):
    """The request body or parameters cannot be decoded or are out of range."""

    status = 400


class AuthError(ServiceError):
    """No bearer token, or one that is not configured. Send `Authorization: Bearer <token>`."""

    status = 401


class DocsAuthError(AuthError):
    """The API docs need a token; the challenge makes a browser prompt for it (the token as password)."""

    headers = {"WWW-Authenticate": 'Basic realm="kvstore"'}


class ForbiddenError(ServiceError):
    """The tenant may not do this (e.g. the shared-memory plane is not enabled for it)."""

    status = 403


class NotFoundError(ServiceError):
    """The chunk, lease or reservation is not there (for this tenant)."""

    status = 404


class PayloadTooLargeError(ServiceError):
    """The body is larger than service.max_body_bytes or the batch has too many chunks."""

    status = 413


class QuotaError(ServiceError):
    """The tenant's byte quota cannot hold even this request's chunks."""

    status = 429


class BackendTimeoutError(ServiceError):
    """A store call did not finish within the request's deadline (slow disk or Redis)."""

    status = 503


class TooManyAbandonedError(ServiceError):
    """Too many timed-out store calls still run (service/abandoned.py): new calls fail fast until they return."""

    status = 503


class MemoryBudgetError(ServiceError):
    """The tenant's shared-memory segments and request buffers would pass its memory budget
    (service.tenant_memory_bytes); close segments or send smaller batches, then retry."""

    status = 429


class LeaseLimitError(ServiceError):
    """The tenant (or all tenants together) holds as many shared-memory slots as it may."""

    status = 429


_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (NoNodeError, 503),
    (LayoutMismatchError, 422),
    (BadChunkError, 400),
    (ConfigError, 400),
    (CorruptChunkError, 404),
    (TierFullError, 429),
    (BackpressureError, 429),
    (TierIOError, 503),
    (KVStoreError, 400),
)


def status_for(exc: Exception) -> int:
    if isinstance(exc, ServiceError):
        return exc.status
    return next((status for cls, status in _STATUS if isinstance(exc, cls)), 500)


def error_body(exc: Exception | str, kind: str | None = None) -> dict[str, str]:
    return {"error": kind or type(exc).__name__, "detail": str(exc)}


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers: store errors, validation errors, HTTP errors and, last, real bugs (500)."""

    async def on_store_error(request: Request, exc: Exception) -> JSONResponse:
        status = status_for(exc)
        if status >= 500:
            logger.warning("%s %s failed: %s", request.method, request.url.path, exc)
        headers = exc.headers if isinstance(exc, ServiceError) else None
        return JSONResponse(error_body(exc), status_code=status, headers=headers)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()[:5]]
        return JSONResponse(error_body("; ".join(parts) or "invalid request", "ValidationError"), status_code=422)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        detail = str(exc.detail)
        if exc.status_code in (404, 405) and detail in ("Not Found", "Method Not Allowed"):
            detail = f"no route {request.method} {request.url.path[:200]}; the API is listed at /docs"
        return JSONResponse(error_body(detail, "HTTPError"), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("%s %s: unexpected error", request.method, request.url.path)
        return JSONResponse(error_body(f"internal error ({type(exc).__name__}); see the daemon log", "InternalError"),
                            status_code=500)

    app.add_exception_handler(KVStoreError, on_store_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_bug)
