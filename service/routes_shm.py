"""Shared-memory data plane routes: only slot offsets cross the socket, never chunk bytes.

    writer: POST /v1/shm/reserve {keys}  -> {grants: [{id, offset, nbytes}]}
            ... write each chunk into the segment at [offset, offset + nbytes) ...
            POST /v1/shm/commit  {ids}   -> put result        (or /v1/shm/abort {ids})
    reader: POST /v1/shm/acquire {keys}  -> {leases: [{id, offset, nbytes} | null]}
            ... copy [offset, offset + nbytes) out ...
            POST /v1/shm/release {ids}

A grant not committed, aborted or released within service.lease_s is reclaimed by the daemon.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from service.routes_data import put_result_body
from service.tenants import Tenant
from service.wire import KEYS_SCHEMA, id_list, key_list, openapi_body, read_structured, reply

logger = logging.getLogger(__name__)
_IDS = openapi_body({"ids": {"type": "array", "maxItems": 64, "items": {"type": "string"}}}, ["ids"])


def _grant(entry: tuple[str, int, int] | None) -> dict[str, object] | None:
    return None if entry is None else {"id": entry[0], "offset": entry[1], "nbytes": entry[2]}


def shm_router(current_tenant: Callable[..., Awaitable[Tenant]]) -> APIRouter:
    router = APIRouter(prefix="/v1/shm", tags=["shared memory"])

    @router.post("/reserve", summary="Reserve host slots to fill in place", openapi_extra=openapi_body({"keys": KEYS_SCHEMA}, ["keys"]))
    async def reserve(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = request.app.state.runtime
        keys = key_list(await read_structured(request))
        grants = await rt.run_put(rt.backend.arena.reserve, tenant, keys)
        return reply(request, {"shm_name": rt.backend.shm_name, "instance": rt.backend.instance_id, "grants": [_grant(g) for g in grants]})

    @router.post("/commit", summary="Publish filled reservations", openapi_extra=_IDS)
    async def commit(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = request.app.state.runtime
        ids = id_list(await read_structured(request))
        result, unknown = await rt.run_put(rt.backend.arena.commit, tenant, ids)
        return reply(request, {**put_result_body(result), "unknown_ids": unknown})

    @router.post("/abort", summary="Give reserved slots back", openapi_extra=_IDS)
    async def abort(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = request.app.state.runtime
        ids = id_list(await read_structured(request))
        unknown = await rt.run(rt.backend.arena.abort, tenant, ids)
        return reply(request, {"aborted": len(set(ids)) - len(unknown), "unknown_ids": unknown})

    @router.post("/acquire", summary="Lease host slots of chunks to copy out (null on a miss)",
                 openapi_extra=openapi_body({"keys": KEYS_SCHEMA}, ["keys"]))
    async def acquire(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = request.app.state.runtime
        keys = key_list(await read_structured(request))
        leases = await rt.run(rt.backend.arena.acquire, tenant, keys)
        return reply(request, {"shm_name": rt.backend.shm_name, "instance": rt.backend.instance_id, "leases": [_grant(g) for g in leases]})

    @router.post("/release", summary="End leases", openapi_extra=_IDS)
    async def release(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
        rt = request.app.state.runtime
        ids = id_list(await read_structured(request))
        unknown = await rt.run(rt.backend.arena.release, tenant, ids)
        return reply(request, {"released": len(set(ids)) - len(unknown), "unknown_ids": unknown})

    return router
