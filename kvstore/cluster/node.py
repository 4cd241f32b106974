"""`ClusterNode`: one store joined to the cluster: index publisher, router, PFS eviction lease, health."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from kvstore.cluster.config import ClusterConfig, ClusterKeys
from kvstore.cluster.events import EventSubscriber
from kvstore.cluster.index import ClusterIndex, NodeInfo
from kvstore.cluster.lease import RedisLease
from kvstore.cluster.pfs_evict import EvictionPass, evict_pfs
from kvstore.cluster.routing import RouteDecision, route
from kvstore.redact import redact_url

if TYPE_CHECKING:
    from kvstore.hashing import TokenIds
    from kvstore.store.tiered_store import TieredStore

logger = logging.getLogger(__name__)


class ClusterNode:
    """Joins `store` to the cluster described by `config`; close it before the store.

    The store keeps serving from its local tiers whatever Redis does; `status()` says whether the
    cluster link is ok or degraded (for /healthz).
    """

    def __init__(self, store: TieredStore, config: ClusterConfig, *, client: Any = None) -> None:
        self.store = store
        self.config = config
        self.keys = ClusterKeys(config.cluster_name)
        self.index = ClusterIndex(config, client=client)
        self.client = self.index.client
        self.index.attach(store)
        self.pfs_lease = RedisLease(self.client, self.keys.pfs_lease, config.node_id, config.pfs_lease_ttl_s)
        self._stop = threading.Event()
        self._janitor: threading.Thread | None = None
        if config.pfs_budget_bytes is not None:
            self._janitor = threading.Thread(target=self._evict_pfs_forever, args=(config.pfs_budget_bytes,),
                                             name="kv-pfs-janitor", daemon=True)
            self._janitor.start()
        logger.info("cluster: node %s joined %r at %s", config.node_id, config.cluster_name, redact_url(config.url))

    def route(self, token_ids: TokenIds, nodes: list[NodeInfo | str] | None = None) -> RouteDecision:
        """The node holding the longest cached prefix of `token_ids` (load breaks ties)."""
        return route(token_ids, nodes, index=self.index, store=self.store)

    def set_load(self, load: float) -> None:
        self.index.set_load(load)

    def evict_pfs(self, budget_bytes: int) -> EvictionPass:
        """One cluster-wide PFS eviction pass, if this node wins the lease (see pfs_evict.py)."""
        return evict_pfs(self.store, self.pfs_lease, budget_bytes)

    def _evict_pfs_forever(self, budget_bytes: int) -> None:
        while not self._stop.wait(self.config.pfs_evict_interval_s):
            try:
                self.evict_pfs(budget_bytes)
            except Exception as exc:  # Redis down (no lease: nobody evicts meanwhile) or a file system error
                logger.warning("PFS eviction pass failed: %s; retrying in %g s", exc, self.config.pfs_evict_interval_s)

    def subscribe(self, last_id: str = "$") -> EventSubscriber:
        return EventSubscriber(self.client, self.config.cluster_name, last_id)

    def status(self) -> dict[str, object]:
        return self.index.status()

    def close(self) -> None:
        self._stop.set()
        if self._janitor is not None:
            self._janitor.join()
        self.index.close()
