"""Routes of the isolated shared-memory plane (service/shm_plane.py): per-client segments.

    POST /v1/shm/segments        {slots}                  -> {id, socket, slots, slot_bytes}
    POST /v1/shm/segments/put    {segment, keys, slots}   -> put result (chunks copied in)
    POST /v1/shm/segments/get    {segment, keys, slots}   -> {found}    (found chunks copied out)
    POST /v1/shm/segments/close  {segment}                -> {closed}
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from kvstore.hashing import ChunkKey
from kvstore.wire_types import (
    ClosedAnswer,
    FoundAnswer,
    PutAnswer,
    SegmentAnswer,
    SegmentCloseRequest,
    SegmentRequest,
    SlotsRequest,
)
from service.openapi_bodies import answer, request_body
from service.runtime import runtime
from service.shm_plane import Segment, check_slots
from service.tenants import Tenant
from service.wire import read_message, reply, request_model

logger = logging.getLogger(__name__)


def segments_router(current_tenant: Callable[..., Awaitable[Tenant]]) -> APIRouter:
    router = APIRouter(prefix="/v1/shm/segments", tags=["shared memory"])

    @router.post("", summary="Create this client's staging segment (its descriptor comes over the unix socket)",
                 openapi_extra=request_body(SegmentRequest), responses=answer(SegmentAnswer))
    async def create(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = runtime(request)
        registry = rt.backend.check_segments(tenant)
        asked = await read_message(request, SegmentRequest)
        segment = await rt.run(registry.create, tenant, asked.slots, rt.backend.layouts.resolve(asked.layout))
        return reply(request, SegmentAnswer(id=segment.id, socket=str(rt.backend.fd_socket), slots=segment.slots,
                                            slot_bytes=segment.slot_bytes))

    @router.post("/put", summary="Store the chunks in these slots (copied into the daemon's memory)",
                 openapi_extra=request_body(SlotsRequest), responses=answer(PutAnswer))
    async def put(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = runtime(request)
        keys, segment, slots = await _slot_request(request, tenant)
        result = await rt.run_put(rt.backend.put_segment, tenant, segment, keys, slots, request_model(request))
        return reply(request, PutAnswer.of(result))

    @router.post("/get", summary="Copy the found chunks into these slots", openapi_extra=request_body(SlotsRequest),
                 responses=answer(FoundAnswer))
    async def get(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = runtime(request)
        keys, segment, slots = await _slot_request(request, tenant)
        found = await rt.run(rt.backend.get_segment, tenant, segment, keys, slots, request_model(request))
        return reply(request, FoundAnswer(found=found))

    @router.post("/close", summary="Close this client's segment",
                 openapi_extra=request_body(SegmentCloseRequest), responses=answer(ClosedAnswer))
    async def close(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        registry = runtime(request).backend.check_segments(tenant)
        registry.close((await read_message(request, SegmentCloseRequest)).segment, tenant.name)
        return reply(request, ClosedAnswer(closed=True))

    return router


async def _slot_request(request: Request, tenant: Tenant) -> tuple[list[ChunkKey], Segment, list[int]]:
    """The keys, the caller's own segment and the checked slot numbers of a put or get body."""
    move = await read_message(request, SlotsRequest)
    segment = runtime(request).backend.check_segments(tenant).get(move.segment, tenant.name)
    return move.keys, segment, check_slots(move.slots, len(move.keys), segment)
