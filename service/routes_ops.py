"""Operator routes scoped by caller: /v1/stats (a tenant sees itself, the admin sees everything)
and the check that guards /metrics (its own token, per-tenant series for the admin only), and which
per-model hit series each caller of /metrics sees."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client.core import Metric

from kvstore.wire_types import TenantSummary
from service.errors import AuthError, BackendTimeoutError, TooManyAbandonedError
from service.memory_report import daemon_memory
from service.model_metrics import ModelFigures, merged, model_families
from service.runtime import runtime
from service.tenants import Caller, Tenant, TenantDirectory
from service.wire import reply

logger = logging.getLogger(__name__)


def tenant_summary(tenant: Tenant, memory: dict[str, int]) -> TenantSummary:
    """The tenant's quota ledger and its memory budget (Backend.tenant_memory)."""
    return TenantSummary(name=tenant.name, used_bytes=tenant.used_bytes, quota_bytes=tenant.quota_limit_bytes,
                         chunks=tenant.num_chunks, fast_lookups=tenant.fast_lookups, **memory)


def metrics_caller(directory: TenantDirectory, credentials: HTTPAuthorizationCredentials | None) -> Caller:
    """Who may read /metrics: anyone when it is open (no auth, no metrics token), else a known token."""
    if directory.metrics_open():
        return Caller(directory.anonymous, admin=True, metrics=True)
    caller = directory.caller_of(credentials.credentials) if credentials is not None else None
    if caller is None:
        raise AuthError("/metrics needs 'Authorization: Bearer <token>': the metrics token "
                        "(service.metrics_token_env), the admin token or a tenant's token")
    return caller


def model_series(caller: Caller, directory: TenantDirectory) -> Iterable[Metric]:
    """The per-model hit series `caller` may see: every tenant's, labelled by tenant, for the admin (and
    an open /metrics); the metrics scraper's summed over tenants (it sees no tenant names); a tenant's
    own only."""
    if caller.admin:
        series: dict[tuple[str, ...], ModelFigures] = {
            (t.name, model): figures for t in directory.all() for model, figures in t.models.snapshot().items()}
        return model_families(series, ("tenant", "model"))
    tenants = [caller.tenant] if caller.tenant is not None else directory.all()
    return model_families(merged(t.models.snapshot() for t in tenants), ("model",))


def stats_router(current_caller: Callable[..., Awaitable[Caller]]) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["operations"])

    @router.get("/stats", summary="Counters: the caller's tenant; store, tiers and every tenant for the admin")
    async def stats(request: Request, caller: Caller = Depends(current_caller)) -> Response:
        rt = runtime(request)
        answer: dict[str, Any] = {}  # an open map: the admin's store counters depend on the configured tiers
        segments = rt.backend.segments
        if caller.tenant is not None:
            answer["tenant"] = tenant_summary(caller.tenant, rt.backend.tenant_memory(caller.tenant))
        if caller.admin:
            try:
                answer.update(await rt.run(rt.backend.store.stats))
            except (BackendTimeoutError, TooManyAbandonedError) as exc:  # a stalled backend: the counters still show
                answer["store_stats_error"] = str(exc)
            answer["memory"] = daemon_memory(rt.backend, answer.get("memory", {}))
            answer["tenants"] = {t.name: tenant_summary(t, rt.backend.tenant_memory(t)) for t in rt.tenants.all()}
            answer["service"] = {"fast_lookups": rt.fast_lookups, **rt.abandoned.snapshot(), **rt.backend.error_counts(),
                                 **rt.backend.fd_socket_stats()}
            answer["all_segments"] = segments.count() if segments is not None else 0
        else:
            answer["service"] = {"fast_lookups": caller.tenant.fast_lookups if caller.tenant else 0}
        return reply(request, answer)

    return router
