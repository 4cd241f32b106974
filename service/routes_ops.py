"""Operator routes scoped by caller: /v1/stats (a tenant sees itself, the admin sees everything)
and the check that guards /metrics (its own token, per-tenant series for the admin only)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials

from service.errors import AuthError, BackendTimeoutError, TooManyAbandonedError
from service.leases import GrantKind
from service.tenants import Caller, Tenant, TenantDirectory
from service.wire import reply

logger = logging.getLogger(__name__)


def tenant_summary(tenant: Tenant, memory: dict[str, int]) -> dict[str, Any]:
    """The tenant's quota ledger and its memory budget (Backend.tenant_memory)."""
    return {"name": tenant.name, "used_bytes": tenant.used_bytes, "quota_bytes": tenant.quota_limit_bytes,
            "chunks": tenant.num_chunks, "fast_lookups": tenant.fast_lookups, **memory}


def metrics_caller(directory: TenantDirectory, credentials: HTTPAuthorizationCredentials | None) -> Caller:
    """Who may read /metrics: anyone when it is open (no auth, no metrics token), else a known token."""
    if directory.metrics_open():
        return Caller(directory.anonymous, admin=True, metrics=True)
    caller = directory.caller_of(credentials.credentials) if credentials is not None else None
    if caller is None:
        raise AuthError("/metrics needs 'Authorization: Bearer <token>': the metrics token "
                        "(service.metrics_token_env), the admin token or a tenant's token")
    return caller


def stats_router(current_caller: Callable[..., Awaitable[Caller]]) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["operations"])

    @router.get("/stats", summary="Counters: the caller's tenant; store, tiers and every tenant for the admin")
    async def stats(request: Request, caller: Caller = Depends(current_caller)) -> Response:
        rt = request.app.state.runtime
        answer: dict[str, Any] = {}
        if caller.tenant is not None:
            answer["tenant"] = tenant_summary(caller.tenant, rt.backend.tenant_memory(caller.tenant))
            answer["grants"] = {k.value: rt.backend.grants.count(k, caller.tenant.name) for k in GrantKind}
        if caller.admin:
            try:
                answer.update(await rt.run(rt.backend.store.stats))
            except (BackendTimeoutError, TooManyAbandonedError) as exc:  # a stalled backend: the counters still show
                answer["store_stats_error"] = str(exc)
            answer["tenants"] = {t.name: tenant_summary(t, rt.backend.tenant_memory(t)) for t in rt.tenants.all()}
            answer["service"] = {"fast_lookups": rt.fast_lookups, **rt.abandoned.snapshot(), **rt.backend.error_counts(),
                                 **rt.backend.fd_socket_stats()}
            answer["all_grants"] = {k.value: rt.backend.grants.count(k) for k in GrantKind}
        else:
            answer["service"] = {"fast_lookups": caller.tenant.fast_lookups if caller.tenant else 0}
        return reply(request, answer)

    return router
