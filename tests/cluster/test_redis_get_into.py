"""Redis tier gets against a real redis-server: values land in the caller's buffers in place, in
large pipelines, mixed with misses, over a password and a db number; damage is caught by the checksum."""

from __future__ import annotations

import pytest
import redis
import torch

from kvstore.errors import CorruptChunkError
from kvstore.types import ChunkMeta
from tiers.redis_tier import RedisTier

pytestmark = pytest.mark.redis


def _payload(seed: int, nbytes: int) -> torch.Tensor:
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _meta(payload: torch.Tensor) -> ChunkMeta:
    return ChunkMeta(codec_id=0, raw_bytes=payload.numel(), stored_bytes=payload.numel(), layout_fingerprint=7)


def _key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def test_get_many_fills_slices_of_one_buffer_in_place(redis_url: str) -> None:
    tier = RedisTier(capacity_bytes=64 << 20, url=redis_url, prefix="gi", pipeline_bytes=3 << 20)
    try:
        nbytes = 1 << 20
        payloads = [_payload(i, nbytes) for i in range(5)]
        tier.put_many([(_key(i), p, _meta(p)) for i, p in enumerate(payloads) if i != 2])
        pool = torch.full((6 * nbytes,), 9, dtype=torch.uint8)
        outs = [pool[(i + 1) * nbytes:(i + 2) * nbytes] for i in range(5)]
        got = tier.get_many([_key(i) for i in range(5)], outs)  # two pipelines of <= 3 MiB
        assert got == [nbytes, nbytes, None, nbytes, nbytes]
        for i in (0, 1, 3, 4):
            assert torch.equal(outs[i], payloads[i])
        assert (outs[2] == 9).all() and (pool[:nbytes] == 9).all()
        # the connection is left at a clean reply boundary: the next pipeline reads right
        assert tier.get_many([_key(4), _key(0)], [outs[0], outs[1]]) == [nbytes, nbytes]
        assert torch.equal(outs[0], payloads[4]) and torch.equal(outs[1], payloads[0])
    finally:
        tier.close()


def test_damaged_value_is_corrupt_and_dropped(redis_url: str) -> None:
    tier = RedisTier(capacity_bytes=8 << 20, url=redis_url, prefix="gd")
    try:
        payload = _payload(1, 100_000)
        tier.put(_key(1), payload, _meta(payload))
        client = redis.Redis.from_url(redis_url)
        client.setrange(tier.redis_key(_key(1)), 64 + 500, b"\x00\xff")
        out = torch.empty(100_000, dtype=torch.uint8)
        with pytest.raises(CorruptChunkError, match="checksum"):
            tier.get_into(_key(1), out)
        assert client.exists(tier.redis_key(_key(1))) == 0 and tier.meta(_key(1)) is None
    finally:
        tier.close()


def test_get_into_works_with_a_password_and_a_db_number(redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url)
    admin.config_set("requirepass", "s3cret")
    try:
        url = redis_url.rsplit("/", 1)[0].replace("redis://", "redis://:s3cret@") + "/3"
        tier = RedisTier(capacity_bytes=8 << 20, url=url, prefix="gp")
        try:
            payload = _payload(2, 50_000)
            tier.put(_key(2), payload, _meta(payload))
            out = torch.empty(50_000, dtype=torch.uint8)
            assert tier.get_into(_key(2), out) == 50_000 and torch.equal(out, payload)
            assert redis.Redis.from_url(url).exists(tier.redis_key(_key(2))) == 1  # in db 3
            tier.remove(_key(2))
        finally:
            tier.close()
    finally:
        redis.Redis.from_url(redis_url.replace("redis://", "redis://:s3cret@")).config_set("requirepass", "")
