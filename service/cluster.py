"""Cluster routes of the daemon: cache-aware routing, the KV event stream, cluster health.

    POST /v1/route           {"token_ids": [...]} or {"keys": [...]}, optional "nodes": [...]
                             -> {"node_id", "cached_tokens", "cached_tokens_by_node"}
    GET  /v1/cluster/nodes   live nodes with their load and url
    GET  /v1/cluster/events  ?last_id=0&count=100&block_ms=0 -> one page of the stored/evicted stream
    GET  /v1/cluster/health  the Redis link: ok or degraded, queued and dropped events, resyncs

Mounted by `attach_cluster(app, store, cluster_config)` once the store is open; without a cluster
these routes answer 503. Redis trouble answers 503 too: the data routes never depend on Redis.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from kvstore.cluster.config import ClusterConfig
from kvstore.flags import parse_bool
from kvstore.hashing import chunk_keys
from kvstore.units import parse_bytes
from kvstore.wire_types import EventEntry, EventsAnswer, NodeEntry, NodesAnswer, RouteAnswer, RouteRequest
from service.auth import resolve_caller, tenant_dependency
from service.errors import BadRequestError, ForbiddenError, ServiceError
from service.openapi_bodies import answer, request_body
from service.runtime import runtime
from service.tenants import Caller, Tenant
from service.wire import read_message, reply

if TYPE_CHECKING:  # redis-py is needed only once a cluster is configured
    from kvstore.cluster.node import ClusterNode
    from kvstore.store.tiered_store import TieredStore

logger = logging.getLogger(__name__)
T = TypeVar("T")

_bearer = HTTPBearer(auto_error=False, description="A tenant token from the daemon's [service.tenants] config")


class ClusterUnavailableError(ServiceError):
    """The daemon runs without a cluster, or Redis does not answer; data routes keep working."""

    status = 503


def cluster_config_from_env(env: dict[str, str] | None = None) -> ClusterConfig | None:
    """ClusterConfig from KVSTORE_CLUSTER_URL (required), _NAME, _NODE_ID, _NODE_URL, _REDIS_CLUSTER,
    _PFS_BUDGET (e.g. 40TiB: run the lease-elected PFS janitor); None when KVSTORE_CLUSTER_URL is unset."""
    env = dict(os.environ if env is None else env)
    url = env.get("KVSTORE_CLUSTER_URL")
    if not url:
        return None
    options: dict[str, Any] = {"url": url, "cluster_name": env.get("KVSTORE_CLUSTER_NAME"), "node_id": env.get("KVSTORE_CLUSTER_NODE_ID"),
               "node_url": env.get("KVSTORE_CLUSTER_NODE_URL"),
               "redis_cluster": parse_bool(env.get("KVSTORE_CLUSTER_REDIS_CLUSTER", "false"),
                                          field="KVSTORE_CLUSTER_REDIS_CLUSTER")}
    if env.get("KVSTORE_CLUSTER_PFS_BUDGET"):
        options["pfs_budget_bytes"] = parse_bytes(env["KVSTORE_CLUSTER_PFS_BUDGET"], field="KVSTORE_CLUSTER_PFS_BUDGET")
    return ClusterConfig(**{k: v for k, v in options.items() if v not in (None, "")})


def attach_cluster(app: FastAPI, store: TieredStore, cluster_config: ClusterConfig | None) -> ClusterNode | None:
    """Join `store` to the cluster and serve the cluster routes; None (routes answer 503) without a config.
    Call `detach_cluster(app)` at shutdown, before the store closes."""
    if not getattr(app.state, "cluster_routes", False):
        app.include_router(cluster_router(), prefix="/v1")
        app.state.cluster_routes = True
    if cluster_config is None:
        app.state.cluster = None
        return None
    from kvstore.cluster.node import ClusterNode

    node = ClusterNode(store, cluster_config)
    app.state.cluster = node
    return node


def detach_cluster(app: FastAPI) -> None:
    node = getattr(app.state, "cluster", None)
    if node is not None:
        node.close()
        app.state.cluster = None


def cluster_status(app: FastAPI) -> dict[str, object] | None:
    """For /healthz: the Redis link's state when the daemon is in a cluster, else None."""
    node = getattr(app.state, "cluster", None)
    if node is None:
        return None
    return {"redis": node.status()["redis"]}  # the details (and nothing secret) at /v1/cluster/health


def _node(request: Request) -> ClusterNode:
    node = getattr(request.app.state, "cluster", None)
    if node is None:
        raise ClusterUnavailableError("this daemon is not in a cluster; start it with KVSTORE_CLUSTER_URL=redis://...")
    return node  # type: ignore[no-any-return]


async def _tenant(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Tenant:
    return await tenant_dependency(runtime(request).tenants)(request, credentials)


async def _caller(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Caller:
    """Any authenticated caller (a tenant, the admin, the metrics scraper): node lists and link health."""
    return resolve_caller(runtime(request).tenants, request, credentials)


async def _admin(caller: Caller = Depends(_caller)) -> Caller:
    """The event stream names every tenant's (mapped) keys: the admin's only."""
    if not caller.admin:
        raise ForbiddenError("the cluster event stream spans tenants: it needs the admin token (service.admin_token_env)")
    return caller


async def _redis_call(fn: Callable[..., T], *args: object) -> T:
    import redis

    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except redis.RedisError as exc:
        raise ClusterUnavailableError(f"Redis does not answer ({exc}); route with a local policy until it does") from exc


def cluster_router() -> APIRouter:
    router = APIRouter(tags=["cluster"])

    @router.post("/route", summary="The node holding the longest cached prefix (load breaks ties)",
                 openapi_extra=request_body(RouteRequest), responses=answer(RouteAnswer))
    async def route(request: Request, tenant: Tenant = Depends(_tenant)) -> Response:
        node = _node(request)
        asked = await read_message(request, RouteRequest)
        chunk_tokens = runtime(request).backend.layouts.resolve(asked.layout).chunk_tokens
        if asked.token_ids is not None:
            limit = runtime(request).backend.config.max_lookup_tokens
            if len(asked.token_ids) > limit:
                raise BadRequestError(f"{len(asked.token_ids)} token ids; the limit is {limit} (service max_lookup_tokens)")
            keys = chunk_keys(asked.token_ids, tenant.root_key, chunk_tokens)
        elif asked.keys is not None:
            keys = asked.keys
        else:
            raise BadRequestError(f"route needs 'token_ids' or 'keys': {RouteRequest.HINT}")
        nodes = asked.nodes
        if nodes is not None and not nodes:
            raise BadRequestError("'nodes' must be a non-empty list of node ids")
        from kvstore.cluster.routing import route_keys

        decision = await _redis_call(lambda: route_keys(tenant.map_keys(keys), nodes, index=node.index))
        return reply(request, RouteAnswer(node_id=decision.node_id, cached_tokens=decision.cached_chunks * chunk_tokens,
                                          cached_tokens_by_node={n: c * chunk_tokens
                                                                 for n, c in decision.prefix_by_node.items()}))

    @router.get("/cluster/nodes", summary="Live nodes with their load and url", responses=answer(NodesAnswer))
    async def nodes(request: Request, caller: Caller = Depends(_caller)) -> Response:
        live = await _redis_call(_node(request).index.live_nodes)
        return reply(request, NodesAnswer(nodes=[NodeEntry(node_id=n.node_id, load=n.load, url=n.url) for n in live]))

    @router.get("/cluster/events", summary="A page of the stored/evicted event stream (Redis Streams)",
                responses=answer(EventsAnswer))
    async def events(request: Request, caller: Caller = Depends(_admin), last_id: str = Query("0", pattern=r"^(\$|\d+(-\d+)?)$"),
                     count: int = Query(100, ge=1, le=10_000), block_ms: int = Query(0, ge=0, le=30_000)) -> Response:
        from kvstore.cluster.events import EventSubscriber

        node = _node(request)
        subscriber = EventSubscriber(node.client, node.config.cluster_name, last_id)
        page = await _redis_call(lambda: subscriber.read(block_ms=block_ms or None, count=count))
        return reply(request, EventsAnswer(last_id=subscriber.last_id, events=[
            EventEntry(id=e.entry_id, node_id=e.node_id, kind=e.kind, tier=e.tier.value if e.tier else None,
                       key=e.key.hex() if e.key else None) for e in page]))

    @router.get("/cluster/health", summary="The Redis link: ok or degraded (the daemon serves from local tiers)")
    async def health(request: Request, caller: Caller = Depends(_caller)) -> dict[str, Any]:
        return _node(request).status()

    return router
