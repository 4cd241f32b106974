"""Everything that talks to Redis also works on a real 3-primary Redis Cluster (hash tags, no cross-slot calls)."""

from __future__ import annotations

import pytest
import torch
from redis.cluster import RedisCluster

from kvstore.cluster import ClusterConfig, ClusterIndex
from kvstore.cluster.config import ClusterKeys
from kvstore.cluster.events import EventSubscriber, summarize
from kvstore.cluster.lease import RedisLease
from kvstore.types import StoreEvent, TierKind
from tests.tiers.conftest import key_of, meta_of, payload_of
from tiers.redis_tier import RedisTier

pytestmark = pytest.mark.redis


def test_redis_tier_on_a_cluster_spreads_chunks_over_primaries(redis_cluster_url: str) -> None:
    tier = RedisTier(capacity_bytes=64 << 20, url=redis_cluster_url, cluster=True, prefix="rc")
    payloads = {key_of(i): payload_of(i, 20_000 + i) for i in range(60)}
    tier.put_many([(key, p, meta_of(p)) for key, p in payloads.items()])
    outs = [torch.empty(20_100, dtype=torch.uint8) for _ in payloads]
    assert tier.get_many(list(payloads), outs) == [p.numel() for p in payloads.values()]
    assert all(torch.equal(out[: p.numel()], p) for out, p in zip(outs, payloads.values(), strict=True))
    fresh = RedisTier(capacity_bytes=64 << 20, url=redis_cluster_url, cluster=True, prefix="rc")
    assert dict(fresh.keys()) == {key: meta_of(p) for key, p in payloads.items()}  # SCAN over every primary
    nodes_used = {tier.client.get_node_from_key(tier.redis_key(key)).name for key in payloads}
    assert len(nodes_used) == 3
    assert fresh.remove(key_of(0)) and tier.get_into(key_of(0), outs[0]) is None
    tier.close()
    fresh.close()


def test_index_events_and_lease_on_a_cluster(redis_cluster_url: str) -> None:
    keys = [key_of(i) for i in range(10)]
    config = ClusterConfig(url=redis_cluster_url, redis_cluster=True, cluster_name="rc", node_id="n1",
                           flush_interval_s=0.01)
    index = ClusterIndex(config)
    index._snapshot = lambda: [(k, [TierKind.HOST]) for k in keys[:5]]  # what store.resident_keys() returns
    index.start()
    assert index.flush()  # the first resync builds the hash aside and RENAMEs it: one slot thanks to the tag
    for key in keys[5:]:
        index.on_event(StoreEvent("stored", key, TierKind.NVME))
    index.on_event(StoreEvent("removed", keys[0], TierKind.HOST))
    assert index.flush() and index.status()["redis"] == "ok"
    assert set(index.node_chunks("n1")) == set(keys[1:])
    assert index.prefix_by_node(keys[1:4]) == {"n1": 3}
    counts = summarize(EventSubscriber(index.client, "rc", "0").read(block_ms=None, count=100))
    assert counts == {"n1/resync/-": 1, "n1/stored/nvme": 5, "n1/evicted/host": 1}
    lease = RedisLease(index.client, ClusterKeys("rc").pfs_lease, "n1", ttl_s=5)
    other = RedisLease(RedisCluster.from_url(redis_cluster_url), ClusterKeys("rc").pfs_lease, "n2", ttl_s=5)
    assert lease.try_acquire() and not other.try_acquire() and lease.renew() and lease.release()
    assert other.try_acquire() and other.release()
    index.close()
