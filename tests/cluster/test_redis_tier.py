"""RedisTier against a real redis-server: the shared Tier contract, then what only Redis does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import torch

from kvstore.chunk_format import HEADER_BYTES
from kvstore.errors import CorruptChunkError, TierFullError, TierIOError
from kvstore.types import TierKind
from tests.tiers.conftest import key_of, meta_of, payload_of
from tests.tiers.test_tier_contract import (  # noqa: F401 - collected here again, over a RedisTier
    test_contains_remove_keys,
    test_full_tier_raises_and_keeps_what_it_has,
    test_malformed_payload_is_bad_chunk,
    test_miss_returns_none,
    test_put_get_is_byte_identical,
    test_replacing_a_key_keeps_only_the_new_bytes,
    test_threads_putting_and_getting_never_see_wrong_bytes,
    test_too_small_output_is_bad_chunk_and_keeps_the_chunk,
    test_used_bytes_follow_footprints,
)
from tiers.redis_tier import RedisTier

pytestmark = [pytest.mark.redis, pytest.mark.parametrize("kind", [TierKind.REDIS], ids=["redis"])]
MiB = 1 << 20


@pytest.fixture
def make_tier(redis_url: str) -> Iterator[Any]:
    """The contract module's factory, building RedisTiers on the session server (emptied per test)."""
    made = []

    def factory(kind: Any, capacity_bytes: Any, **overrides: Any) -> Any:
        assert kind is TierKind.REDIS
        tier = RedisTier(capacity_bytes=capacity_bytes, url=redis_url, prefix="t", **overrides)
        made.append(tier)
        return tier

    yield factory
    for tier in made:
        tier.close()


def test_a_chunk_put_by_one_node_is_a_hit_on_another(make_tier: Any, kind: Any) -> None:
    node_a, node_b = make_tier(kind, 4 * MiB), make_tier(kind, 4 * MiB)
    payload = payload_of(5, 70_000)
    node_a.put(key_of(5), payload, meta_of(payload))
    assert node_b.meta(key_of(5)) == meta_of(payload)
    out = torch.empty(70_000, dtype=torch.uint8)
    assert node_b.get_into(key_of(5), out) == 70_000 and torch.equal(out, payload)
    assert node_b.used_bytes == node_b.footprint(70_000)  # seen, so counted in its view
    node_a.remove(key_of(5))
    assert node_b.get_into(key_of(5), out) is None and node_b.used_bytes == 0


def test_keys_recovers_by_scan_in_a_new_process_view(make_tier: Any, kind: Any) -> None:
    writer = make_tier(kind, 64 * MiB)
    payloads = {key_of(i): payload_of(i, 3000 + i) for i in range(1200)}  # more than one SCAN page
    writer.put_many([(key, p, meta_of(p)) for key, p in payloads.items()])
    reader = make_tier(kind, 64 * MiB)
    assert reader.used_bytes == 0
    assert dict(reader.keys()) == {key: meta_of(p) for key, p in payloads.items()}
    assert reader.used_bytes == writer.used_bytes


def test_pipelined_get_many_returns_every_chunk_and_misses(make_tier: Any, kind: Any) -> None:
    tier = make_tier(kind, 64 * MiB, pipeline_bytes=200_000)  # several round trips
    payloads = [payload_of(i, 90_000) for i in range(8)]
    tier.put_many([(key_of(i), p, meta_of(p)) for i, p in enumerate(payloads)])
    outs = [torch.empty(90_000, dtype=torch.uint8) for _ in range(9)]
    assert tier.get_many([key_of(i) for i in range(9)], outs) == [90_000] * 8 + [None]
    assert all(torch.equal(out, p) for out, p in zip(outs, payloads, strict=False))


def test_corrupt_value_raises_once_then_is_a_miss(make_tier: Any, kind: Any, redis_url: str) -> None:
    tier = make_tier(kind, MiB)
    payload = payload_of(9, 10_000)
    tier.put(key_of(9), payload, meta_of(payload))
    with redis.Redis.from_url(redis_url) as client:
        client.setrange(tier.redis_key(key_of(9)), HEADER_BYTES + 17, b"\xff\x00")  # flip payload bytes
    with pytest.raises(CorruptChunkError):
        tier.get_into(key_of(9), torch.empty(10_000, dtype=torch.uint8))
    assert tier.get_into(key_of(9), torch.empty(10_000, dtype=torch.uint8)) is None
    assert tier.num_corrupt_dropped == 1 and tier.used_bytes == 0


def test_redis_maxmemory_refusal_is_tier_full(make_tier: Any, kind: Any, redis_url: str) -> None:
    tier = make_tier(kind, 64 * MiB)
    with redis.Redis.from_url(redis_url) as client:
        client.config_set("maxmemory", client.info("memory")["used_memory"] + 2 * MiB)
        try:
            payload = payload_of(1, 4 * MiB)
            with pytest.raises(TierFullError, match="maxmemory"):
                tier.put(key_of(1), payload, meta_of(payload))
        finally:
            client.config_set("maxmemory", 0)
    assert tier.used_bytes == 0


def test_value_over_proto_max_bulk_len_is_refused_before_sending(make_tier: Any, kind: Any) -> None:
    tier = make_tier(kind, 64 * MiB)
    tier._max_value_bytes = MiB  # as if the server said proto-max-bulk-len 1mb
    payload = payload_of(2, MiB)
    with pytest.raises(TierFullError, match="proto-max-bulk-len"):
        tier.put(key_of(2), payload, meta_of(payload))
    assert not tier.contains(key_of(2))


def test_redis_down_is_tier_io_error_and_fails_fast(make_redis_server: Any, kind: Any) -> None:
    server = make_redis_server()
    tier = RedisTier(capacity_bytes=MiB, url=server.url, retry_after_s=60)
    payload = payload_of(3, 1000)
    tier.put(key_of(3), payload, meta_of(payload))
    server.kill()
    with pytest.raises(TierIOError, match=str(server.port)):
        tier.get_into(key_of(3), torch.empty(1000, dtype=torch.uint8))
    for _ in range(100):  # the breaker answers without touching the network
        with pytest.raises(TierIOError, match="unreachable"):
            tier.meta(key_of(3))
    assert list(tier.keys()) == []  # recovery with Redis down recovers nothing, and does not raise
    tier.close()
