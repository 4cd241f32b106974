"""`ClusterIndex`: which nodes and tiers hold each chunk, in Redis, fed in batches from store events.

    store event ──> bounded deque (drop-oldest, counted) ──> writer thread, one pipeline per batch:
                    HSET/HDEL kv:{NAME:NODE}:idx  key+tier ...   PEXPIRE (liveness)   XADD events

Each node owns one hash (its hash tag spreads nodes over Redis Cluster slots); its TTL is renewed
by every write and heartbeat, so a dead node's entries expire together after `entry_ttl_s`. The
hash holds a marker field: when Redis restarted or the hash expired, the marker is gone and the
node republishes everything it holds from `store.resident_keys()` (resync), as it does after an
outage or after events were dropped. Redis down or slow never blocks or fails the store.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvstore.cluster import events as event_stream
from kvstore.cluster.config import ClusterConfig, ClusterKeys
from kvstore.cluster.health import ClusterHealth
from kvstore.types import StoreEvent, TierKind

if TYPE_CHECKING:
    from kvstore.store.tiered_store import TieredStore

logger = logging.getLogger(__name__)

TIERS = list(TierKind)
MARKER = b"epoch"  # a field no chunk field (17 bytes) can equal
Snapshot = Callable[[], list[tuple[bytes, list[TierKind]]]]


def field_of(key: bytes, tier: TierKind) -> bytes:
    return key + bytes([TIERS.index(tier)])


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A live node as routers see it."""

    node_id: str
    load: float = 0.0
    url: str = ""


class ClusterIndex:
    """One node's publisher into the cluster index, and queries over every live node's entries.

    Args:
        config: the cluster settings.
        client: a redis-py client (default: one made from config.url, no retries, short timeouts).
        health: shared health object (default: a new one).
        clock: wall-clock seconds (node registration scores are shared across machines).
    """

    def __init__(self, config: ClusterConfig, *, client: Any = None, health: ClusterHealth | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        from tiers.redis_support import make_client

        self.config = config
        self.keys = ClusterKeys(config.cluster_name)
        self.client = client or make_client(config.url, cluster=config.redis_cluster,
                                            socket_timeout_s=config.socket_timeout_s,
                                            connect_timeout_s=config.socket_timeout_s)
        self.health = health or ClusterHealth(config.url, slow_s=config.slow_s, retry_s=config.retry_s)
        self._clock = clock
        self._snapshot: Snapshot = lambda: []
        self._queue: collections.deque[StoreEvent] = collections.deque()
        self._cond = threading.Condition()
        self._needs_resync = True
        self._busy = False
        self._stopping = False
        self._load = 0.0
        self._next_heartbeat = 0.0
        self.num_events_written = 0
        self._thread: threading.Thread | None = None

    # ----- wiring --------------------------------------------------------------------------------
    def attach(self, store: TieredStore) -> ClusterIndex:
        """Publish `store`'s chunks now (resync) and every change from now on; starts the writer."""
        self._snapshot = store.resident_keys
        store.add_listener(self.on_event)
        return self.start()

    def start(self) -> ClusterIndex:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kv-cluster-index", daemon=True)
            self._thread.start()
        return self

    def on_event(self, event: StoreEvent) -> None:
        """The store listener: O(1), never blocks; the oldest event is dropped when the queue is full."""
        with self._cond:
            if len(self._queue) >= self.config.max_queued_events:
                self._queue.popleft()
                self._needs_resync = True  # the index no longer follows from the events: rebuild it
                self.health.dropped()
            self._queue.append(event)
            if len(self._queue) >= self.config.batch_size:
                self._cond.notify()

    def set_load(self, load: float) -> None:
        """This node's load (e.g. requests in flight), published with the next heartbeat."""
        self._load = float(load)

    # ----- writer thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._stopping:
                    self._cond.wait(timeout=self.config.flush_interval_s)
                if self._stopping:
                    return
                if not self.health.should_try():
                    self._cond.wait(timeout=min(self.config.retry_s, 0.1))
                    continue
                self._busy = True
            try:
                self._step()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _step(self) -> None:
        start = time.perf_counter()
        try:
            talked = self._needs_resync or bool(self._queue) or time.monotonic() >= self._next_heartbeat
            if self._needs_resync:
                self.resync()
            self._write_batch()
            if time.monotonic() >= self._next_heartbeat:
                self.heartbeat()
        except Exception as exc:  # Redis or client trouble: never let the writer thread die
            with self._cond:
                self._needs_resync = True  # what was lost is rebuilt from the store when Redis answers
            import redis  # here, not at import: the routing simulation (`kvstore replay --nodes`) needs no redis

            if not isinstance(exc, redis.RedisError):
                logger.exception("cluster index write failed")
            self.health.failed(exc)
            return
        if talked:  # an idle pass says nothing about Redis
            self.health.succeeded(time.perf_counter() - start)

    def _write_batch(self) -> None:
        with self._cond:
            batch = [self._queue.popleft() for _ in range(min(len(self._queue), self.config.batch_size))]
        if not batch:
            return
        latest: dict[bytes, str] = {}
        groups: dict[tuple[str, TierKind], list[bytes]] = {}
        for event in batch:
            latest[field_of(event.key, event.tier)] = event.kind
            groups.setdefault((event.kind, event.tier), []).append(event.key)
        stored = [f for f, kind in latest.items() if kind == "stored"]
        removed = [f for f, kind in latest.items() if kind != "stored"]
        index_key = self.keys.node_index(self.config.node_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hexists(index_key, MARKER)
        if stored:
            pipe.hset(index_key, mapping=dict.fromkeys(stored, int(self._clock())))
        if removed:
            pipe.hdel(index_key, *removed)
        pipe.pexpire(index_key, int(self.config.entry_ttl_s * 1000))
        event_stream.append_batches(pipe, self.keys, self.config.node_id, groups, self.config.stream_maxlen)
        try:
            had_marker = pipe.execute()[0]
        except Exception:
            self.health.dropped(len(batch))  # taken off the queue and not written: lost until the resync
            raise
        self.num_events_written += len(batch)
        if not had_marker:
            self._mark_lost()

    def _mark_lost(self) -> None:
        with self._cond:
            if not self._needs_resync:
                logger.info("cluster: index of node %s is missing in Redis (restart or expiry); resyncing",
                            self.config.node_id)
            self._needs_resync = True

    def heartbeat(self) -> None:
        """Register this node (time, load, url) and renew its entries' TTL; notice a lost index."""
        now_ms = int(self._clock() * 1000)
        ttl_ms = int(self.config.entry_ttl_s * 1000)
        node = self.config.node_id
        pipe = self.client.pipeline(transaction=False)
        pipe.hexists(self.keys.node_index(node), MARKER)
        pipe.pexpire(self.keys.node_index(node), ttl_ms)
        pipe.zadd(self.keys.nodes, {node: now_ms + ttl_ms})  # score: when this registration expires
        pipe.zremrangebyscore(self.keys.nodes, "-inf", now_ms - 10 * ttl_ms)  # long-dead registrations
        pipe.hset(self.keys.load, mapping={node: repr(self._load), f"url:{node}": self.config.node_url})
        if not pipe.execute()[0]:
            self._mark_lost()
        self._next_heartbeat = time.monotonic() + self.config.heartbeat_s

    def resync(self) -> int:
        """Rewrite this node's whole entry from the store's snapshot (built aside, then RENAMEd in)."""
        with self._cond:
            self._needs_resync = False
            self._queue.clear()  # the snapshot, taken after this, already reflects these events
        snapshot = self._snapshot()
        node = self.config.node_id
        staging, index_key = self.keys.node_index_staging(node), self.keys.node_index(node)
        fields = [field_of(key, tier) for key, tiers in snapshot for tier in tiers]
        now = int(self._clock())
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(staging)
            for start in range(0, len(fields), 4096):
                pipe.hset(staging, mapping=dict.fromkeys(fields[start:start + 4096], now))
            pipe.hset(staging, MARKER, now)
            pipe.execute()
            self.client.rename(staging, index_key)  # its own call: Redis Cluster pipelines refuse RENAME
            pipe = self.client.pipeline(transaction=False)
            pipe.pexpire(index_key, int(self.config.entry_ttl_s * 1000))
            event_stream.append_resync(pipe, self.keys, node, len(snapshot), self.config.stream_maxlen)
            pipe.execute()
        except Exception:
            with self._cond:
                self._needs_resync = True
            raise
        self.health.resynced()
        logger.info("cluster: node %s published its index: %d chunks, %d tier entries", node, len(snapshot), len(fields))
        self.heartbeat()
        return len(snapshot)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued event is written (and a pending resync done). False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._cond.notify_all()
            while self._queue or self._busy or self._needs_resync:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(timeout=min(remaining, 0.02))
        return True

    def close(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (briefly, when Redis is up), then stop the writer."""
        if self.health.is_ok:
            self.flush(timeout_s)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s + self.config.socket_timeout_s)

    # ----- queries -----------------------------------------------------------------------------------
    def live_nodes(self) -> list[NodeInfo]:
        """Nodes whose registration has not expired (each node's own entry_ttl_s), with their load and url."""
        names = self.client.zrangebyscore(self.keys.nodes, int(self._clock() * 1000), "+inf")
        node_ids = [n.decode() for n in names]
        if not node_ids:
            return []
        values = self.client.hmget(self.keys.load, [*node_ids, *(f"url:{n}" for n in node_ids)])
        loads, urls = values[: len(node_ids)], values[len(node_ids):]
        return [NodeInfo(n, float(load or 0.0), (url or b"").decode()) for n, load, url in zip(node_ids, loads, urls,
                                                                                               strict=True)]

    def holders(self, keys: Sequence[bytes], node_ids: Sequence[str] | None = None) -> list[dict[str, list[TierKind]]]:
        """For each key, the nodes (live ones by default) holding it and in which tiers."""
        node_ids = list(node_ids) if node_ids is not None else [n.node_id for n in self.live_nodes()]
        result: list[dict[str, list[TierKind]]] = [{} for _ in keys]
        if not keys or not node_ids:
            return result
        fields = [field_of(key, tier) for key in keys for tier in TIERS]
        pipe = self.client.pipeline(transaction=False)
        for node in node_ids:
            pipe.hmget(self.keys.node_index(node), fields)
        for node, values in zip(node_ids, pipe.execute(), strict=True):
            for i in range(len(keys)):
                tiers = [tier for t, tier in enumerate(TIERS) if values[i * len(TIERS) + t] is not None]
                if tiers:
                    result[i][node] = tiers
        return result

    def prefix_by_node(self, keys: Sequence[bytes], node_ids: Sequence[str] | None = None) -> dict[str, int]:
        """Per node, how many leading keys it holds (in any tier)."""
        node_ids = list(node_ids) if node_ids is not None else [n.node_id for n in self.live_nodes()]
        lengths = dict.fromkeys(node_ids, 0)
        open_nodes = set(node_ids)
        for where in self.holders(keys, node_ids):
            open_nodes &= set(where)
            for node in open_nodes:
                lengths[node] += 1
            if not open_nodes:
                break
        return lengths

    def node_chunks(self, node_id: str) -> dict[bytes, list[TierKind]]:
        """Everything one node's entry says it holds (for a consumer's resync, and for tests)."""
        chunks: dict[bytes, list[TierKind]] = {}
        for field in self.client.hkeys(self.keys.node_index(node_id)):
            if field != MARKER:
                chunks.setdefault(field[:-1], []).append(TIERS[field[-1]])
        return chunks

    def status(self) -> dict[str, object]:
        with self._cond:
            depth = len(self._queue)
        return self.health.status(node_id=self.config.node_id, queued_events=depth,
                                  max_queued_events=self.config.max_queued_events,
                                  events_written=self.num_events_written)
