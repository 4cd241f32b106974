"""The proxy's FastAPI app: OpenAI's generation routes through prefill then decode, /v1/models from a decode
instance, /health and /metrics (both without auth, as vLLM serves them).

    POST /v1/completions, /v1/chat/completions   prefill -> decode (handoff.py); `stream: true` streams
    GET  /v1/models                              a decode instance's answer
    GET  /health                                 200 while a decode instance is healthy, else 503
    GET  /metrics                                Prometheus text (metrics.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from service.errors import AuthError, BadRequestError, PayloadTooLargeError, install_error_handlers, status_for
from service.exposition import CONTENT_TYPE
from service.pd_proxy.bodies import check_body
from service.pd_proxy.config import ProxyConfig
from service.pd_proxy.handoff import generate, to_decode
from service.pd_proxy.health import poll_forever
from service.pd_proxy.state import ProxyState

GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")


class ProxyAuthError(AuthError):
    """No `Authorization: Bearer <key>` header, or not the proxy's --api-key."""

    headers = {"WWW-Authenticate": "Bearer"}


def create_app(config: ProxyConfig) -> FastAPI:
    """The proxy for `config`; its HTTP client and health poller live as long as the app's lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=2 * config.max_in_flight + 16, max_keepalive_connections=64)
        async with httpx.AsyncClient(limits=limits, headers={"Accept-Encoding": "identity"}) as client:
            state = ProxyState.create(config, client)
            app.state.proxy = state
            poller = asyncio.create_task(poll_forever(client, [state.prefill, state.decode],
                                                      interval_s=config.health_interval_s,
                                                      timeout_s=config.health_timeout_s, headers=state.upstream_headers("health")))
            try:
                yield
            finally:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
                state.close()

    app = FastAPI(title="kvstore pd-proxy", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    for path in GENERATION_ROUTES:
        app.add_api_route(path, _generation_route(path), methods=["POST"])
    app.add_api_route("/v1/models", _models, methods=["GET"])
    app.add_api_route("/health", _health, methods=["GET"])
    app.add_api_route("/metrics", _metrics, methods=["GET"])
    return app


def _state(request: Request) -> ProxyState:
    return request.app.state.proxy  # type: ignore[no-any-return]


def _check_auth(state: ProxyState, request: Request) -> None:
    """Raises ProxyAuthError unless the request carries the proxy's API key (when it has one)."""
    key = state.config.api_key
    if not key:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), key.encode()):
        state.metrics.count("rejected", reason="auth")
        raise ProxyAuthError("this proxy needs 'Authorization: Bearer <key>' with its --api-key "
                             "(KVSTORE_PD_PROXY_API_KEY)")


async def read_json(state: ProxyState, request: Request) -> object:
    """The request body as JSON, read up to `max_body_bytes`.

    Raises:
        PayloadTooLargeError: larger than the limit (by Content-Length or as read).
        BadRequestError: not JSON.
    """
    limit = state.config.max_body_bytes
    declared = request.headers.get("content-length", "")
    data = bytearray()
    if not (declared.isdigit() and int(declared) > limit):
        async for piece in request.stream():
            data += piece
            if len(data) > limit:
                break
    if len(data) > limit or (declared.isdigit() and int(declared) > limit):
        state.metrics.count("rejected", reason="body_too_large")
        raise PayloadTooLargeError(f"request body over the proxy's limit of {limit} bytes; "
                                   f"send a shorter prompt or raise --max-body-bytes")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise BadRequestError(f"the body is not JSON ({exc}); send an OpenAI request as application/json") from exc


def _generation_route(path: str) -> Callable[[Request], Awaitable[Response]]:
    async def route(request: Request) -> Response:
        state = _state(request)
        _check_auth(state, request)
        slot = state.admit()
        try:
            body = check_body(await read_json(state, request), route=path)
            response = await generate(state, body, path=path, headers=state.upstream_headers(_request_id()), slot=slot)
        except BaseException as exc:
            slot.release()
            state.metrics.count("requests", route=path, status=str(status_for(exc) if isinstance(exc, Exception) else 499))
            raise
        if not isinstance(response, StreamingResponse):  # a stream frees its slot when it ends
            slot.release()
        state.metrics.count("requests", route=path, status=str(response.status_code))
        return response

    return route


def _request_id() -> str:
    return f"pd-{uuid.uuid4().hex}"


async def _models(request: Request) -> Response:
    state = _state(request)
    _check_auth(state, request)
    slot = state.admit()
    try:
        return await to_decode(state, "GET", "/v1/models", None, headers=state.upstream_headers(_request_id()),
                               near_node_id=None, stream=False, slot=slot)
    finally:
        slot.release()


async def _health(request: Request) -> JSONResponse:
    state = _state(request)
    counts = {pool.role.value: sum(i.is_healthy for i in pool.instances) for pool in (state.prefill, state.decode)}
    return JSONResponse({"status": "ok" if counts["decode"] else "no healthy decode instance",
                         "healthy_instances": counts}, status_code=200 if counts["decode"] else 503)


async def _metrics(request: Request) -> PlainTextResponse:
    state = _state(request)
    return PlainTextResponse(state.metrics.render([state.prefill, state.decode], state.num_in_flight),
                             media_type=CONTENT_TYPE)
