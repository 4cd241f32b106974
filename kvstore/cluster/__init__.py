"""Beyond one node: a Redis-backed cluster index, KV event stream, PFS eviction lease and routers."""

from kvstore.cluster.config import ClusterConfig, ClusterKeys
from kvstore.cluster.index import ClusterIndex, NodeInfo
from kvstore.cluster.node import ClusterNode
from kvstore.cluster.routing import RouteDecision, make_router, route

__all__ = ["ClusterConfig", "ClusterIndex", "ClusterKeys", "ClusterNode", "NodeInfo", "RouteDecision",
           "make_router", "route"]
