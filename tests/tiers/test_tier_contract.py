"""The `Tier` contract, run over every tier kind that is built: bytes, misses, accounting, errors, threads."""

from __future__ import annotations

import random
import struct
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from kvstore.errors import BadChunkError, TierFullError
from tests.tiers.conftest import CONTRACT_KINDS, key_of, meta_of, payload_of
from tiers.base import Tier

pytestmark = pytest.mark.parametrize("kind", CONTRACT_KINDS, ids=lambda kind: kind.value)
MiB = 1 << 20


@pytest.mark.parametrize("nbytes", [1, 4095, 4096, 4097, MiB + 3])
def test_put_get_is_byte_identical(make_tier: Callable[..., Tier], kind: Any, nbytes: Any) -> None:
    tier = make_tier(kind, 8 * MiB)
    payload = payload_of(nbytes, nbytes)
    tier.put(key_of(0), payload, meta_of(payload))
    # an exactly sized buffer, and a larger one that starts off a 4 KiB boundary
    for out in (torch.empty(nbytes, dtype=torch.uint8), torch.zeros(nbytes + 4097, dtype=torch.uint8)[1:]):
        assert tier.get_into(key_of(0), out) == nbytes
        assert torch.equal(out[:nbytes], payload)
    assert tier.meta(key_of(0)) == meta_of(payload)


@pytest.mark.parametrize("nbytes", [4097, 5 * MiB + 3])  # one read, and several streamed segments
def test_streamed_get_announces_growing_fronts_ending_with_the_whole(make_tier: Callable[..., Tier], kind: Any, nbytes: int) -> None:
    from kvstore.chunk_format import aligned_empty

    tier = make_tier(kind, 16 * MiB)
    payload = payload_of(nbytes, nbytes)
    tier.put(key_of(0), payload, meta_of(payload))
    announced: list[int] = []
    out = aligned_empty(nbytes)
    assert tier.get_into_streamed(key_of(0), out, announced.append) == nbytes
    assert torch.equal(out, payload)
    assert announced and announced == sorted(set(announced)) and announced[-1] == nbytes
    before = len(announced)
    assert tier.get_into_streamed(key_of(1), out, announced.append) is None
    assert len(announced) == before  # a miss announces nothing


def test_miss_returns_none(make_tier: Callable[..., Tier], kind: Any) -> None:
    tier = make_tier(kind, MiB)
    out = torch.empty(4096, dtype=torch.uint8)
    assert tier.get_into(key_of(1), out) is None
    assert tier.meta(key_of(1)) is None
    assert not tier.contains(key_of(1))
    assert tier.remove(key_of(1)) is False


def test_contains_remove_keys(make_tier: Callable[..., Tier], kind: Any) -> None:
    tier = make_tier(kind, 4 * MiB)
    payloads = {key_of(i): payload_of(i, 1000 + i) for i in range(3)}
    for key, payload in payloads.items():
        tier.put(key, payload, meta_of(payload))
    assert dict(tier.keys()) == {key: meta_of(payload) for key, payload in payloads.items()}
    assert all(tier.contains(key) for key in payloads)
    assert tier.remove(key_of(1)) is True
    assert tier.remove(key_of(1)) is False
    assert not tier.contains(key_of(1))
    assert tier.get_into(key_of(1), torch.empty(2000, dtype=torch.uint8)) is None
    assert set(dict(tier.keys())) == {key_of(0), key_of(2)}


def test_used_bytes_follow_footprints(make_tier: Callable[..., Tier], kind: Any) -> None:
    tier = make_tier(kind, 4 * MiB)
    assert tier.used_bytes == 0
    first, second = payload_of(1, 5000), payload_of(2, 70_000)
    tier.put(key_of(1), first, meta_of(first))
    assert tier.used_bytes == tier.footprint(5000)
    tier.put(key_of(2), second, meta_of(second))
    assert tier.used_bytes == tier.footprint(5000) + tier.footprint(70_000)
    tier.remove(key_of(1))
    assert tier.used_bytes == tier.footprint(70_000)
    tier.remove(key_of(2))
    assert tier.used_bytes == 0


def test_full_tier_raises_and_keeps_what_it_has(make_tier: Callable[..., Tier], kind: Any) -> None:
    nbytes = 64 * 1024
    probe = make_tier(kind, MiB)
    footprint = probe.footprint(nbytes)
    probe.close()  # one owner per NVMe directory (tiers/dir_lock.py)
    tier = make_tier(kind, 2 * footprint)
    payloads = [payload_of(i, nbytes) for i in range(3)]
    tier.put(key_of(0), payloads[0], meta_of(payloads[0]))
    tier.put(key_of(1), payloads[1], meta_of(payloads[1]))
    used = tier.used_bytes
    with pytest.raises(TierFullError):
        tier.put(key_of(2), payloads[2], meta_of(payloads[2]))
    assert tier.used_bytes == used <= tier.capacity_bytes
    assert not tier.contains(key_of(2))
    out = torch.empty(nbytes, dtype=torch.uint8)
    for i in (0, 1):
        assert tier.get_into(key_of(i), out) == nbytes and torch.equal(out, payloads[i])


def test_replacing_a_key_keeps_only_the_new_bytes(make_tier: Callable[..., Tier], kind: Any) -> None:
    tier = make_tier(kind, 4 * MiB)
    old, new = payload_of(1, 10_000), payload_of(2, 300_000)
    tier.put(key_of(7), old, meta_of(old, codec_id=0))
    tier.put(key_of(7), new, meta_of(new, codec_id=1))
    out = torch.empty(300_000, dtype=torch.uint8)
    assert tier.get_into(key_of(7), out) == 300_000 and torch.equal(out, new)
    assert tier.used_bytes == tier.footprint(300_000)
    assert dict(tier.keys()) == {key_of(7): meta_of(new, codec_id=1)}


def test_too_small_output_is_bad_chunk_and_keeps_the_chunk(make_tier: Callable[..., Tier], kind: Any) -> None:
    tier = make_tier(kind, MiB)
    payload = payload_of(3, 10_000)
    tier.put(key_of(3), payload, meta_of(payload))
    with pytest.raises(BadChunkError, match="10000"):
        tier.get_into(key_of(3), torch.empty(9_999, dtype=torch.uint8))
    out = torch.empty(10_000, dtype=torch.uint8)
    assert tier.get_into(key_of(3), out) == 10_000 and torch.equal(out, payload)


@pytest.mark.parametrize("bad", [torch.zeros(1024, dtype=torch.float16), torch.zeros(2, 512, dtype=torch.uint8),
                                 torch.zeros(2048, dtype=torch.uint8)[::2]], ids=["fp16", "2d", "strided"])
def test_malformed_payload_is_bad_chunk(make_tier: Callable[..., Tier], kind: Any, bad: Any) -> None:
    tier = make_tier(kind, MiB)
    meta = meta_of(torch.zeros(1024, dtype=torch.uint8))
    with pytest.raises(BadChunkError):
        tier.put(key_of(4), bad, meta)
    assert not tier.contains(key_of(4))
    assert tier.used_bytes == 0


def _versioned_payload(key_index: int, version: int) -> torch.Tensor:
    """A payload whose first 16 bytes say which (key, version) it is, so a reader can check every byte."""
    nbytes = 16 + 1000 * (1 + (key_index * 7 + version) % 40)
    payload = payload_of(key_index * 100_000 + version, nbytes)
    payload[:16] = torch.frombuffer(bytearray(struct.pack("<qq", key_index, version)), dtype=torch.uint8)
    return payload


def test_threads_putting_and_getting_never_see_wrong_bytes(make_tier: Callable[..., Tier], kind: Any) -> None:
    """4 threads replace and read 6 keys at once; every read is one whole version of its own key."""
    tier = make_tier(kind, 16 * MiB)
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        out = torch.empty(64 * 1024, dtype=torch.uint8)
        for step in range(60):
            key_index = rng.randrange(6)
            if rng.random() < 0.5:
                payload = _versioned_payload(key_index, seed * 1000 + step)
                tier.put(key_of(key_index), payload, meta_of(payload))
                continue
            nbytes = tier.get_into(key_of(key_index), out)
            if nbytes is None:
                continue
            got_key, version = struct.unpack("<qq", bytes(out[:16].numpy()))
            if got_key != key_index or not torch.equal(out[:nbytes], _versioned_payload(key_index, version)):
                errors.append(f"key {key_index}: read {nbytes} bytes claiming ({got_key}, {version}) that do not match")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert tier.used_bytes == sum(tier.footprint(meta.stored_bytes) for _, meta in tier.keys())
