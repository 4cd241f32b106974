"""Beyond one node: a Redis-backed cluster index, KV event stream, PFS eviction lease and routers.

Names are imported on first use, so `kvstore.cluster.config` (and code that only builds a
ClusterConfig) works where redis-py is not installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the real names for the type checker; at run time each loads on first use
    from kvstore.cluster.config import ClusterConfig, ClusterKeys
    from kvstore.cluster.index import ClusterIndex, NodeInfo
    from kvstore.cluster.node import ClusterNode
    from kvstore.cluster.routing import RouteDecision, make_router, route

_EXPORTS = {
    "ClusterConfig": "kvstore.cluster.config", "ClusterKeys": "kvstore.cluster.config",
    "ClusterIndex": "kvstore.cluster.index", "NodeInfo": "kvstore.cluster.index",
    "ClusterNode": "kvstore.cluster.node",
    "RouteDecision": "kvstore.cluster.routing", "make_router": "kvstore.cluster.routing", "route": "kvstore.cluster.routing",
}
__all__ = ["ClusterConfig", "ClusterIndex", "ClusterKeys", "ClusterNode", "NodeInfo", "RouteDecision", "make_router", "route"]


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kvstore.cluster' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
