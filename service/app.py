"""`create_app`: the daemon's FastAPI app (control plane) around one TieredStore.

    GET  /healthz                    ready once the index is rebuilt (the store opens before binding); no token
    GET  /v1/info                    layout, the tenant's namespace root, shm segment, limits
    POST /v1/lookup                  token ids or keys -> cached tokens and keys
    PUT|GET|DELETE /v1/chunks/{key}  one chunk, raw bytes (application/octet-stream)
    POST /v1/chunks/put|get|delete   batches (msgpack: keys + concatenated chunk bytes)
    POST /v1/shm/segments/...        shared memory: per-client memfd segments (service/routes_segments.py)
    GET  /v1/stats, /metrics         counters as JSON (scoped to the caller) and as Prometheus text
                                     (metrics_token / admin token when auth is on)
    GET  /docs, /openapi.json        OpenAPI docs from packaged Swagger UI files (service/docs.py); a token as
                                     Bearer or as the HTTP Basic password (a browser prompts on the 401)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvstore.config import StoreConfig
from kvstore.hashing import Namespace
from kvstore.store import TieredStore
from kvstore.wire_types import HealthAnswer
from service import metrics
from service.auth import bearer_scheme, caller_dependency, docs_dependency, tenant_dependency
from service.backend import Backend
from service.body_limits import BodyDeadlineMiddleware, install_disconnect_handler
from service.config import ServiceConfig
from service.docs import install_offline_docs
from service.errors import install_error_handlers
from service.exposition import CONTENT_TYPE, gauge, render
from service.fast_lookup import FastLookupMiddleware
from service.memory_report import daemon_memory
from service.openapi_bodies import answer
from service.routes_data import data_router
from service.routes_ops import metrics_caller, model_series, stats_router
from service.routes_segments import segments_router
from service.runtime import Runtime, runtime
from service.tenants import TenantDirectory
from service.wire import BodyLimitMiddleware, reply

logger = logging.getLogger(__name__)


def create_app(store_config: StoreConfig, service_config: ServiceConfig, *,
               store_factory: Callable[[StoreConfig], TieredStore] = TieredStore,
               on_startup: Sequence[Callable[[FastAPI, TieredStore], object]] = (),
               on_shutdown: Sequence[Callable[[FastAPI], object]] = ()) -> FastAPI:
    """The app; the store is opened (index rebuilt) at startup and closed (writes drained) at shutdown.

    `on_startup` hooks run once the store is open, before the first request (e.g. joining a cluster
    and mounting its routes); `on_shutdown` hooks run before the store closes.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await anyio.to_thread.run_sync(store_factory, store_config)
        try:
            backend = await anyio.to_thread.run_sync(Backend, store, service_config, directory.all())
        except BaseException:  # e.g. a tier it cannot write: refuse to start, writes drained
            await anyio.to_thread.run_sync(store.close)
            raise
        app.state.runtime = Runtime(backend, directory, service_config.io_threads)
        try:
            if service_config.shm:
                backend.open_segments(directory.tenant_of_token, _fd_socket_path(service_config))
            for hook in on_startup:
                await anyio.to_thread.run_sync(hook, app, store)
        except BaseException:
            await anyio.to_thread.run_sync(store.close)
            raise
        reaper = asyncio.create_task(_reap_forever(app.state.runtime, service_config.lease_s))
        logger.info("store open: %d chunks indexed, shm=%s, tenants=%d", store.stats()["chunks"],
                    backend.shm_plane, len(service_config.tenants))
        try:
            yield
        finally:
            reaper.cancel()
            for stop in on_shutdown:
                await anyio.to_thread.run_sync(stop, app)
            await anyio.to_thread.run_sync(_shutdown, backend)

    app = FastAPI(title="kvstore", version="1", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  description="Tiered KV-cache store: control plane of the sidecar daemon.")
    namespace = Namespace(model_id=store_config.model_id, layout_fingerprint=store_config.layout.fingerprint,
                          tenant_salt=store_config.tenant_salt)
    directory = TenantDirectory(service_config.tenants, namespace, admin_token=service_config.admin_token,
                                metrics_token=service_config.metrics_token)
    current_tenant = tenant_dependency(directory)
    install_offline_docs(app, docs_dependency(directory))  # /docs from packaged Swagger UI files, behind a token
    install_error_handlers(app)
    install_disconnect_handler(app)
    app.add_middleware(FastLookupMiddleware)  # innermost: inside the body limit and the timing
    app.add_middleware(BodyLimitMiddleware, max_bytes=service_config.max_body_bytes)
    app.add_middleware(BodyDeadlineMiddleware, timeout_s=service_config.body_timeout_s)
    app.add_middleware(TimingMiddleware)
    app.include_router(_ops_router())
    app.include_router(data_router(current_tenant), dependencies=[Depends(current_tenant)])
    app.include_router(segments_router(current_tenant), dependencies=[Depends(current_tenant)])
    app.include_router(stats_router(caller_dependency(directory)))
    return app


async def _reap_forever(rt: Runtime, lease_s: float) -> None:
    while True:
        await asyncio.sleep(min(1.0, lease_s / 4))
        try:
            rt.backend.reap_segments()  # no store call: runs even while a stalled backend holds the I/O threads
        except Exception:
            logger.exception("segment reaper failed")


def _fd_socket_path(config: ServiceConfig) -> Path:
    """service.shm_socket, else a fresh name in the temp directory, once the sockets that killed
    daemons left there are removed."""
    from service.fd_server import remove_stale_sockets

    if config.shm_socket:
        return Path(config.shm_socket)
    directory = Path(tempfile.gettempdir())
    remove_stale_sockets(directory)
    return directory / f"kvstore-{os.getpid()}-{secrets.token_hex(4)}.fds"


def _shutdown(backend: Backend) -> None:
    logger.info("shutting down: closing shared-memory segments, draining background writes")
    backend.close_segments()
    backend.store.close()
    backend.ledger.close()
    logger.info("store closed")


def _ops_router() -> APIRouter:
    router = APIRouter(tags=["operations"])

    @router.get("/healthz", summary="Liveness and readiness (ready once the index is rebuilt); no configuration",
                responses=answer(HealthAnswer))
    async def healthz(request: Request) -> Response:
        from service.cluster import cluster_status  # cheap: redis is imported only inside a cluster

        return reply(request, HealthAnswer(status="ready", cluster=cluster_status(request.app)))

    @router.get("/metrics", summary="Prometheus text format (a token unless open; per-tenant series for the admin)",
                response_class=PlainTextResponse)
    async def prometheus(request: Request,
                         credentials: HTTPAuthorizationCredentials | None = Depends(bearer_scheme)) -> PlainTextResponse:
        rt = runtime(request)
        caller = metrics_caller(rt.tenants, credentials)
        stats = await rt.run(rt.backend.store.stats)
        families = [*metrics.store_families(stats), *rt.requests.families(), *model_series(caller, rt.tenants)]
        if caller.admin:
            families.append(gauge("kvstore_tenant_bytes", "Bytes a tenant holds (quota ledger).",
                                  (((t.name,), t.used_bytes) for t in sorted(rt.tenants.all(), key=lambda t: t.name)),
                                  ("tenant",)))
        families += metrics.memory_families(daemon_memory(rt.backend, stats.get("memory", {})))
        segments = rt.backend.segments
        families.append(gauge("kvstore_shm_segments", "Open shared-memory segments of clients.",
                              [((), segments.count() if segments is not None else 0)]))
        return PlainTextResponse(render(families), media_type=CONTENT_TYPE)

    return router


class TimingMiddleware:
    """Counts requests and observes their latency per route template (pure ASGI: no extra task)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            rt = getattr(getattr(scope.get("app"), "state", None), "runtime", None)
            if rt is not None:
                rt.requests.observe(route, scope["method"], status, time.perf_counter() - start)

