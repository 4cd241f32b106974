"""HTTP routes for chunk data and lookups: single chunks as raw bytes, batches as msgpack."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import torch
from fastapi import APIRouter, Depends, Header, Path, Request
from fastapi.responses import Response
from starlette.background import BackgroundTask

from kvstore.wire_types import (
    GetAnswer,
    InfoAnswer,
    KeysRequest,
    LookupAnswer,
    LookupRequest,
    PutAnswer,
    PutRequest,
    RegisterAnswer,
    RegisterRequest,
    RemovedAnswer,
    RemovedManyAnswer,
)
from service.errors import BadRequestError, NotFoundError
from service.openapi_bodies import answer, request_body
from service.runtime import Runtime, runtime
from service.tenants import Tenant
from service.wire import parse_key, read_message, reply, request_model

logger = logging.getLogger(__name__)

KEY_PATH = Path(description="chunk key, 32 hex characters", pattern="^[0-9a-fA-F]{32}$")
LAYOUT_HEADER = Header(None, alias="X-KV-Layout", description="layout fingerprint (16 hex; absent: the default "
                       "layout); 422 unless registered")


async def lookup_answer(rt: Runtime, tenant: Tenant, request: LookupRequest, model: str) -> LookupAnswer:
    """POST /v1/lookup's answer to a decoded body (shared with service/fast_lookup.py), counted for
    `model` in the tenant's per-model hit rates."""
    layout = rt.backend.layouts.resolve(request.layout)
    chunk_tokens = layout.chunk_tokens
    if request.token_ids is not None:
        token_ids = request.token_ids
        if len(token_ids) > rt.backend.config.max_lookup_tokens:
            raise BadRequestError(f"{len(token_ids)} token ids; the limit is {rt.backend.config.max_lookup_tokens}")
        hits = await rt.run_lookup(rt.backend.lookup_tokens, tenant, token_ids, layout)
        asked = len(token_ids) // chunk_tokens
    elif request.keys is not None:
        keys = request.keys
        hits = keys[: await rt.run_lookup(rt.backend.lookup_keys, tenant, keys)]
        asked = len(keys)
    else:
        raise BadRequestError(f"lookup needs 'token_ids' or 'keys': {LookupRequest.HINT}")
    tenant.models.count_lookup(model, asked, len(hits), len(hits) * chunk_tokens)
    return LookupAnswer(num_tokens=len(hits) * chunk_tokens, num_chunks=len(hits), keys=hits)


def data_router(current_tenant: Callable[..., Awaitable[Tenant]]) -> APIRouter:
    """/v1/info, /v1/lookup and the chunk routes (one chunk as raw bytes, batches as msgpack)."""
    router = APIRouter(prefix="/v1", tags=["data"])
    _add_info(router, current_tenant)
    _add_register(router, current_tenant)
    _add_lookup(router, current_tenant)
    _add_chunk_routes(router, current_tenant)
    _add_batch_put(router, current_tenant)
    _add_batch_get(router, current_tenant)
    _add_batch_delete(router, current_tenant)
    return router


def _add_info(router: APIRouter, current_tenant: Callable[..., Awaitable[Tenant]]) -> None:
    @router.get("/info", summary="Layout, the tenant's namespace root key, shared-memory segment, limits",
                responses=answer(InfoAnswer))
    async def info(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        b = runtime(request).backend
        cfg = b.config
        return reply(request, InfoAnswer(
            tenant=tenant.name, model_id=b.store.config.model_id, layout=b.layout.to_dict(),
            layout_fingerprint=f"{b.layout.fingerprint:016x}", chunk_bytes=b.layout.chunk_bytes,
            root_key=tenant.root_key, instance=b.instance_id, shm_plane=b.shm_plane if tenant.shm else None,
            lease_s=cfg.lease_s, max_batch_chunks=cfg.max_batch_chunks, max_body_bytes=cfg.max_body_bytes,
            any_layout=b.store.layouts.is_open))


def _add_register(router: APIRouter, current_tenant: Callable[..., Awaitable[Tenant]]) -> None:
    @router.post("/layouts", summary="Register the model this client computes for and its KV layout",
                 description="A daemon with no layout in its config serves every registered layout from one set of "
                             "tiers; one with a layout refuses any other (422, naming both). One model name keeps "
                             "one layout per tenant (422 for another). Later requests name the layout by the "
                             "answered fingerprint.",
                 openapi_extra=request_body(RegisterRequest), responses=answer(RegisterAnswer))
    async def register(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        asked = await read_message(request, RegisterRequest)
        layout = runtime(request).backend.layouts.register(tenant.name, asked.model, asked.layout.to_layout())
        return reply(request, RegisterAnswer(layout_fingerprint=f"{layout.fingerprint:016x}",
                                             chunk_bytes=layout.chunk_bytes))


def _add_lookup(router: APIRouter, current_tenant: Callable[..., Awaitable[Tenant]]) -> None:
    @router.post("/lookup", summary="Cached leading tokens of a prompt (token_ids) or leading held keys (keys)",
                 openapi_extra=request_body(LookupRequest), responses=answer(LookupAnswer))
    async def lookup(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        body = await read_message(request, LookupRequest)
        return reply(request, await lookup_answer(runtime(request), tenant, body, request_model(request)))


def _add_chunk_routes(router: APIRouter, current_tenant: Callable[..., Awaitable[Tenant]]) -> None:
    """PUT, GET and DELETE /v1/chunks/{key}: one chunk, its raw bytes as the body."""
    @router.put("/chunks/{key}", summary="Store one chunk (raw bytes of the layout's chunk shape and dtype)",
                openapi_extra={"requestBody": {"required": True, "content": {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
                responses=answer(PutAnswer))
    async def put_chunk(request: Request, key: str = KEY_PATH, layout: str | None = LAYOUT_HEADER,
                        tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = runtime(request)
        chunk_layout = rt.backend.layouts.resolve(layout)
        chunk_key = parse_key(key)
        body = await request.body()
        result = await rt.run_put(rt.backend.put_many, tenant, [chunk_key], body, chunk_layout, request_model(request))
        return reply(request, PutAnswer.of(result))

    @router.get("/chunks/{key}", summary="One chunk's raw bytes (404 on a miss)",
                responses={200: {"content": {"application/octet-stream": {}}}})
    async def get_chunk(request: Request, key: str = KEY_PATH, layout: str | None = LAYOUT_HEADER,
                        tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = runtime(request)
        chunk_layout = rt.backend.layouts.resolve(layout)
        chunk_key = parse_key(key)
        found, buffer = await rt.run(rt.backend.get_many, tenant, [chunk_key], request_model(request), chunk_layout)
        if not found[0]:
            rt.backend.response_buffers.give(buffer)
            raise NotFoundError(f"chunk {key} is not stored (or was evicted); recompute it")
        return Response(buffer.numpy().data, media_type="application/octet-stream",
                        headers={"X-KV-Layout": f"{chunk_layout.fingerprint:016x}"},
                        background=BackgroundTask(rt.backend.response_buffers.give, buffer))

    @router.delete("/chunks/{key}", summary="Remove one chunk from every tier", responses=answer(RemovedAnswer))
    async def delete_chunk(request: Request, key: str = KEY_PATH, tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = runtime(request)
        removed = await rt.run(rt.backend.remove, tenant, parse_key(key))
        return reply(request, RemovedAnswer(removed=removed))


def _add_batch_put(router: APIRouter, current_tenant: Callable[..., Awaitable[Tenant]]) -> None:
    @router.post("/chunks/put", summary="Store a batch: keys + their chunks' bytes concatenated (msgpack)",
                 openapi_extra=request_body(PutRequest), responses=answer(PutAnswer))
    async def put_batch(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = runtime(request)
        put = await read_message(request, PutRequest, limit=None)  # chunk bytes: only max_body_bytes applies
        layout = rt.backend.layouts.resolve(put.layout)
        result = await rt.run_put(rt.backend.put_many, tenant, put.keys, put.data, layout, request_model(request))
        return reply(request, PutAnswer.of(result))


def _add_batch_get(router: APIRouter, current_tenant: Callable[..., Awaitable[Tenant]]) -> None:
    @router.post("/chunks/get", summary="Read a batch: found flags + the found chunks' bytes concatenated",
                 description="With `Accept: application/octet-stream` the body is the found chunks' bytes and "
                             "the X-KV-Found header holds one 0/1 per key.",
                 openapi_extra=request_body(KeysRequest), responses=answer(GetAnswer))
    async def get_batch(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = runtime(request)
        asked = await read_message(request, KeysRequest)
        layout = rt.backend.layouts.resolve(asked.layout)
        found, buffer = await rt.run(rt.backend.get_many, tenant, asked.keys, request_model(request), layout)
        return _batch_get_answer(request, found, buffer, layout.chunk_bytes)


def _batch_get_answer(request: Request, found: list[bool], buffer: torch.Tensor, n: int) -> Response:
    """The found chunks' bytes (`n` each): raw with X-KV-Found flags when the client accepts octet-stream, else
    msgpack/JSON {"found", "data"}. `buffer` goes back to the backend's pool once no longer needed."""
    backend = runtime(request).backend
    raw = buffer.numpy().data
    if "application/octet-stream" in request.headers.get("accept", "") and all(found):
        # the buffer itself is the body (no copy); it returns to the pool once sent
        return Response(raw, media_type="application/octet-stream", headers={"X-KV-Found": "1" * len(found)},
                        background=BackgroundTask(backend.response_buffers.give, buffer))
    data = b"".join(raw[i * n:(i + 1) * n] for i, ok in enumerate(found) if ok)
    backend.response_buffers.give(buffer)
    if "application/octet-stream" in request.headers.get("accept", ""):
        return Response(data, media_type="application/octet-stream",
                        headers={"X-KV-Found": "".join("1" if ok else "0" for ok in found)})
    return reply(request, GetAnswer(found=found, data=data))


def _add_batch_delete(router: APIRouter, current_tenant: Callable[..., Awaitable[Tenant]]) -> None:
    @router.post("/chunks/delete", summary="Remove a batch of chunks", openapi_extra=request_body(KeysRequest),
                 responses=answer(RemovedManyAnswer))
    async def delete_batch(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = runtime(request)
        keys = (await read_message(request, KeysRequest)).keys
        rt.backend.check_batch(len(keys))
        removed = [await rt.run(rt.backend.remove, tenant, k) for k in keys]
        return reply(request, RemovedManyAnswer(removed=removed))
