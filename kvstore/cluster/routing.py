"""Routers: which node should serve a request. Cache-aware (longest cached prefix, load breaks ties),
its balanced variant (the same among nodes not overloaded), round-robin, and first-block hash.

A router sees the request's chunk keys and the candidate nodes; the cache-aware one also asks a
`PrefixFn` how many leading keys each node holds (the Redis cluster index in a daemon, per-node
caches in the simulation), so the same router code runs in both.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import xxhash

from kvstore.cluster.index import ClusterIndex, NodeInfo
from kvstore.errors import ConfigError, NoNodeError, UnknownNameError

if TYPE_CHECKING:
    from kvstore.hashing import TokenIds
    from kvstore.types import ChunkStore

logger = logging.getLogger(__name__)

PrefixFn = Callable[[Sequence[bytes], Sequence[str]], dict[str, int]]


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where to send a request and why: the chosen node, its cached leading chunks, every node's count."""

    node_id: str
    cached_chunks: int
    prefix_by_node: dict[str, int] = field(default_factory=dict)


class Router(Protocol):
    """What every router does: pick a node for a request's chunk keys among the candidates."""

    name: str

    def choose(self, keys: Sequence[bytes], nodes: Sequence[NodeInfo]) -> RouteDecision: ...


class CacheAwareRouter:
    """The node holding the longest cached prefix; among equals, the least loaded (then by name).

    Args:
        prefix_fn: how many leading keys each node holds.
        max_load_gap: None = pure longest prefix. Otherwise only nodes whose load is within this
            much of the least loaded node's are candidates, so a prefix every request shares (a
            system prompt) cannot pull all traffic onto one node (see `cache-aware-balanced`).
    """

    name = "cache-aware"

    def __init__(self, prefix_fn: PrefixFn, *, max_load_gap: float | None = None) -> None:
        if max_load_gap is not None and max_load_gap < 0:
            raise ConfigError(f"max_load_gap must be >= 0, got {max_load_gap}")
        self.prefix_fn = prefix_fn
        self.max_load_gap = max_load_gap

    def choose(self, keys: Sequence[bytes], nodes: Sequence[NodeInfo]) -> RouteDecision:
        _require(nodes)
        if self.max_load_gap is not None:
            floor = min(n.load for n in nodes) + self.max_load_gap
            nodes = [n for n in nodes if n.load <= floor]
        lengths = self.prefix_fn(keys, [n.node_id for n in nodes]) if keys else {}
        best = min(nodes, key=lambda n: (-lengths.get(n.node_id, 0), n.load, n.node_id))
        return RouteDecision(best.node_id, lengths.get(best.node_id, 0), dict(lengths))


class BalancedCacheAwareRouter(CacheAwareRouter):
    """Cache-aware among the nodes whose load is within `max_load_gap` (default 1.0) of the least loaded."""

    name = "cache-aware-balanced"

    def __init__(self, prefix_fn: PrefixFn, *, max_load_gap: float = 1.0) -> None:
        super().__init__(prefix_fn, max_load_gap=max_load_gap)


class RoundRobinRouter:
    """Each request to the next node in turn (cache-blind baseline)."""

    name = "round-robin"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, keys: Sequence[bytes], nodes: Sequence[NodeInfo]) -> RouteDecision:
        _require(nodes)
        return RouteDecision(nodes[next(self._counter) % len(nodes)].node_id, 0)


class FirstBlockHashRouter:
    """The node with the highest xxh3(node, first chunk key): requests sharing their first chunk meet on
    one node (rendezvous hashing: adding a node moves only its share of first blocks)."""

    name = "first-block-hash"

    def choose(self, keys: Sequence[bytes], nodes: Sequence[NodeInfo]) -> RouteDecision:
        _require(nodes)
        first = keys[0] if keys else b""
        best = max(nodes, key=lambda n: (xxhash.xxh3_64_intdigest(n.node_id.encode() + first), n.node_id))
        return RouteDecision(best.node_id, 0)


RouterClass = type[CacheAwareRouter] | type[RoundRobinRouter] | type[FirstBlockHashRouter]
ROUTERS: dict[str, RouterClass] = {r.name: r for r in (CacheAwareRouter, BalancedCacheAwareRouter, RoundRobinRouter,
                                                       FirstBlockHashRouter)}


def make_router(name: str, prefix_fn: PrefixFn | None = None, *, max_load_gap: float | None = None) -> Router:
    """A router by name; the cache-aware ones need `prefix_fn` and take `max_load_gap` (None: the class default)."""
    router_class = ROUTERS.get(name)
    if router_class is None:
        raise UnknownNameError(f"unknown routing {name!r}; valid: {', '.join(ROUTERS)}")
    if not issubclass(router_class, CacheAwareRouter):
        if max_load_gap is not None:
            raise ConfigError(f"{name} routing is cache-blind and takes no max_load_gap; drop it or choose "
                              "cache-aware-balanced")
        return router_class()
    if prefix_fn is None:
        raise ConfigError(f"{name} routing needs a prefix function (the cluster index)")
    if max_load_gap is None:
        return router_class(prefix_fn)
    return router_class(prefix_fn, max_load_gap=max_load_gap)


def route(token_ids: TokenIds, nodes: Sequence[NodeInfo | str] | None, *, index: ClusterIndex, store: ChunkStore,
          max_load_gap: float | None = None) -> RouteDecision:
    """The live node holding the longest cached prefix of `token_ids` (load breaks ties).

    Args:
        token_ids: the prompt.
        nodes: candidates (NodeInfo or node ids); None = every live node in the index, with its load.
        index: the cluster index to ask.
        store: gives the chunk keys (same model, layout and tenant salt as the nodes).
        max_load_gap: see CacheAwareRouter (None: pure longest prefix).
    """
    return route_keys(store.chunk_keys(token_ids), nodes, index=index, max_load_gap=max_load_gap)


def route_keys(keys: Sequence[bytes], nodes: Sequence[NodeInfo | str] | None, *, index: ClusterIndex,
               max_load_gap: float | None = None) -> RouteDecision:
    """`route` for chunk keys already computed (e.g. mapped to a tenant's keys by the daemon)."""
    live = {n.node_id: n for n in index.live_nodes()}
    if nodes is None:
        candidates = list(live.values())
    else:
        candidates = [n if isinstance(n, NodeInfo) else live.get(n, NodeInfo(n)) for n in nodes]
    return CacheAwareRouter(index.prefix_by_node, max_load_gap=max_load_gap).choose(keys, candidates)


def _require(nodes: Sequence[NodeInfo]) -> None:
    if not nodes:
        raise NoNodeError("no node to route to: the candidate list is empty (are the nodes' heartbeats reaching Redis?)")
