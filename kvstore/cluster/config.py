"""`ClusterConfig`: how a node joins the Redis-backed cluster index, event stream and PFS eviction lease."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from kvstore.errors import ConfigError


def default_node_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """One node's view of the cluster.

    Attributes:
        url: the Redis server (redis://host:port/db) or any node of a Redis Cluster (with redis_cluster=True).
        cluster_name: nodes with the same name share an index; it is the hash tag of the shared keys.
        node_id: this node's name in the index and on the event stream (unique per daemon).
        node_url: where routers send this node's requests (reported with its load); optional.
        entry_ttl_s: a node's index entries expire this long after its last successful write
            (heartbeats renew them), so a dead node's chunks leave the index on their own.
        heartbeat_s: how often a live node renews its entries and registration (< entry_ttl_s / 2).
        batch_size: most store events written per pipeline round trip.
        max_queued_events: events held while Redis is slow or down; beyond it the oldest are dropped
            (counted) and the index is resynced from the store when Redis answers again.
        flush_interval_s: longest an event waits before it is written.
        stream_maxlen: approximate length the event stream is trimmed to (XADD MAXLEN ~).
        socket_timeout_s: a Redis call slower than this counts as a failure (degraded).
        slow_s: a round trip slower than this marks the cluster link degraded ("slow").
        retry_s: while degraded, how often Redis is tried again.
        pfs_lease_ttl_s: the PFS eviction lease expires this long after its holder stops renewing it.
        pfs_budget_bytes: when set, every node runs a janitor that, holding the lease, evicts the
            oldest chunk files until the shared PFS directory fits this budget (give each node's PFS
            tier a capacity_bytes at least this large, so only the janitor evicts from the PFS).
        pfs_evict_interval_s: how often each node's janitor tries to take the lease.
    """

    url: str = "redis://127.0.0.1:6379/0"
    redis_cluster: bool = False
    cluster_name: str = "kvstore"
    node_id: str = field(default_factory=default_node_id)
    node_url: str = ""
    entry_ttl_s: float = 30.0
    heartbeat_s: float = 5.0
    batch_size: int = 2048
    max_queued_events: int = 100_000
    flush_interval_s: float = 0.05
    stream_maxlen: int = 100_000
    socket_timeout_s: float = 1.0
    slow_s: float = 0.5
    retry_s: float = 1.0
    pfs_lease_ttl_s: float = 10.0
    pfs_budget_bytes: int | None = None
    pfs_evict_interval_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.cluster_name or any(c in self.cluster_name for c in "{}:"):
            raise ConfigError(f"cluster_name {self.cluster_name!r} must be non-empty without '{{', '}}' or ':'")
        if not self.node_id or any(c in self.node_id for c in "{}"):
            raise ConfigError(f"node_id {self.node_id!r} must be non-empty without '{{' or '}}'")
        for name in ("entry_ttl_s", "heartbeat_s", "flush_interval_s", "socket_timeout_s", "slow_s", "retry_s",
                     "pfs_lease_ttl_s", "pfs_evict_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"cluster {name} must be > 0, got {getattr(self, name)}")
        if self.heartbeat_s * 2 > self.entry_ttl_s:
            raise ConfigError(f"heartbeat_s ({self.heartbeat_s}) must be at most half of entry_ttl_s "
                              f"({self.entry_ttl_s}), or a live node's entries expire between heartbeats")
        if self.pfs_budget_bytes is not None and self.pfs_budget_bytes < 0:
            raise ConfigError(f"pfs_budget_bytes must be >= 0, got {self.pfs_budget_bytes}")
        if self.batch_size < 1 or self.max_queued_events < self.batch_size or self.stream_maxlen < 1:
            raise ConfigError(f"need batch_size >= 1 ({self.batch_size}), max_queued_events >= batch_size "
                              f"({self.max_queued_events}) and stream_maxlen >= 1 ({self.stream_maxlen})")


@dataclass(frozen=True, slots=True)
class ClusterKeys:
    """Redis key names. Hash tags ({...}) keep what one command or script touches in one Cluster slot:

        kv:{NAME}:nodes            ZSET node -> registration expiry (ms) (small, shared)
        kv:{NAME}:load             HASH node -> load, url               (small, shared)
        kv:{NAME}:events           STREAM of stored/evicted batches     (XADD MAXLEN ~)
        kv:{NAME}:lease:pfs-evict  STRING owner token, PX ttl           (the PFS eviction lease)
        kv:{NAME:NODE}:idx         HASH key(16 B)+tier(1 B) -> time     (one per node: spreads over slots;
                                                                         its TTL is the node's liveness)
    """

    cluster_name: str

    @property
    def nodes(self) -> str:
        return f"kv:{{{self.cluster_name}}}:nodes"

    @property
    def load(self) -> str:
        return f"kv:{{{self.cluster_name}}}:load"

    @property
    def events(self) -> str:
        return f"kv:{{{self.cluster_name}}}:events"

    @property
    def pfs_lease(self) -> str:
        return f"kv:{{{self.cluster_name}}}:lease:pfs-evict"

    def node_index(self, node_id: str) -> str:
        return f"kv:{{{self.cluster_name}:{node_id}}}:idx"

    def node_index_staging(self, node_id: str) -> str:
        """Where a resync builds the new index before RENAME (same hash tag, so same slot)."""
        return f"kv:{{{self.cluster_name}:{node_id}}}:idx:resync"
