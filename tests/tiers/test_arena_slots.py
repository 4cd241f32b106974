"""A memory tier's slots (tiers/arena.py): one packed int per chunk, leases that outlive a removal, reservations,
metadata ids reused, and the allocator's space always what the held and leased slots take."""

from __future__ import annotations

import random

import pytest
import torch

from kvstore.errors import TierFullError
from kvstore.types import ChunkMeta
from tests.tiers.conftest import key_of, meta_of, payload_of
from tiers.host import HostTier
from tiers.meta_ids import MetaIds

KiB = 1 << 10


def _host(capacity: int = 256 * KiB) -> HostTier:
    return HostTier(capacity_bytes=capacity, pin=False, prefault=False)  # 256-byte slots under 256 KiB


def _read(tier: HostTier, key: bytes, nbytes: int) -> torch.Tensor | None:
    out = torch.empty(nbytes, dtype=torch.uint8)
    return None if tier.get_into(key, out) is None else out


def test_a_leased_slot_outlives_its_removal_and_its_replacement() -> None:
    tier = _host()
    old, new = payload_of(1, 3000), payload_of(2, 5000)
    tier.put(key_of(0), old, meta_of(old))
    with tier.lease(key_of(0)) as found:
        assert found is not None
        view, meta = found
        tier.put(key_of(0), new, meta_of(new))  # replaced while leased: the old slot is not reused
        filler = payload_of(3, 3000)
        tier.put(key_of(1), filler, meta_of(filler))
        assert tier.remove(key_of(0)) and tier.meta(key_of(0)) is None
        assert torch.equal(view, old) and meta.stored_bytes == 3000
        assert tier.used_bytes == 2 * tier.footprint(3000)  # the leased old slot and the filler
    assert tier.used_bytes == tier.footprint(3000)  # the lease ended: the old slot went back
    assert torch.equal(_read(tier, key_of(1), 3000), filler)  # type: ignore[arg-type]


def test_a_reservation_is_committed_with_its_own_size_or_aborted() -> None:
    tier = _host()
    offset = tier.reserve(1000)
    tier.slot_view(offset, 1000).copy_(payload_of(4, 1000))
    wrong = ChunkMeta(codec_id=0, raw_bytes=999, stored_bytes=999, layout_fingerprint=1)
    with pytest.raises(ValueError, match="stored_bytes=999 but the slot holds 1000 bytes"):
        tier.commit(key_of(0), offset, wrong)
    assert tier.meta(key_of(0)) is None  # refused: nothing held, the reservation stands
    tier.commit(key_of(0), offset, meta_of(payload_of(4, 1000)))
    assert torch.equal(_read(tier, key_of(0), 1000), payload_of(4, 1000))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no slot is reserved at offset"):
        tier.commit(key_of(1), offset, meta_of(payload_of(4, 1000)))  # committed already
    spare = tier.reserve(700)
    tier.abort(spare)
    with pytest.raises(ValueError, match="no slot is reserved at offset"):
        tier.abort(spare)
    assert tier.used_bytes == tier.footprint(1000)


def test_a_put_whose_metadata_disagrees_with_its_bytes_is_refused_and_holds_nothing() -> None:
    tier = _host()
    payload = payload_of(5, 2000)
    with pytest.raises(ValueError, match="pass the metadata of the bytes stored"):
        tier.put(key_of(0), payload, ChunkMeta(codec_id=1, raw_bytes=4000, stored_bytes=1500, layout_fingerprint=1))
    assert tier.meta(key_of(0)) is None and tier.used_bytes == 0 and len(tier) == 0


def test_slots_through_random_puts_removes_and_leases_match_a_model() -> None:
    """Compressed-like chunks of many sizes (many metadata values) come and go under open leases: every read
    returns the bytes last put, space is what held and still-leased slots take, metadata ids are reused."""
    rng = random.Random(7)
    tier = _host(1 << 20)
    held: dict[int, torch.Tensor] = {}
    leases: list[tuple[bytes, int, torch.Tensor, int]] = []  # key, offset, the bytes it held then, footprint
    for step in range(4000):
        k = rng.randrange(64)
        op = rng.random()
        if op < 0.45:
            payload = payload_of(step, rng.randint(1, 9000))
            meta = ChunkMeta(codec_id=1, raw_bytes=9000, stored_bytes=payload.numel(), layout_fingerprint=k % 3)
            try:
                tier.put(key_of(k), payload, meta)
            except TierFullError:  # a full arena (the store would evict first)
                continue
            held[k] = payload
        elif op < 0.65:
            assert tier.remove(key_of(k)) == (held.pop(k, None) is not None)
        elif op < 0.8 and k in held:
            found = tier.acquire(key_of(k))
            assert found is not None
            offset, meta = found
            leases.append((key_of(k), offset, held[k], tier.footprint(meta.stored_bytes)))
        elif leases:
            key, offset, payload, _ = leases.pop(rng.randrange(len(leases)))
            assert torch.equal(tier.slot_view(offset, payload.numel()), payload)  # intact while leased
            tier.release_slot(key, offset)
        if k in held:
            assert torch.equal(_read(tier, key_of(k), held[k].numel()), held[k])  # type: ignore[arg-type]
        live = {offset: size for _, offset, _, size in leases}
        for i, payload in held.items():
            found = tier.acquire(key_of(i))
            assert found is not None
            live[found[0]] = tier.footprint(payload.numel())
            tier.release_slot(key_of(i), found[0])
        assert tier.used_bytes == sum(live.values())
        assert len(tier._metas) <= len(held)  # a removed chunk's metadata id went back (a lease keeps its size only)
    for key, offset, _, _ in leases:
        tier.release_slot(key, offset)
    for k in list(held):
        tier.remove(key_of(k))
    assert tier.used_bytes == 0 and len(tier._metas) == 0 and len(tier) == 0


def test_past_its_metadata_ids_a_put_or_commit_is_refused_and_loses_no_space() -> None:
    """2**25 distinct metadata values cannot be made on this machine: the table is given a limit of 2 (a fault
    injected, not a mock of the tier)."""
    tier = _host()
    tier._metas = MetaIds(2)

    def meta(n: int) -> ChunkMeta:
        return ChunkMeta(codec_id=1, raw_bytes=4096, stored_bytes=n, layout_fingerprint=1)

    tier.put(key_of(0), payload_of(0, 1000), meta(1000))
    tier.put(key_of(1), payload_of(1, 1100), meta(1100))
    used = tier.used_bytes
    with pytest.raises(TierFullError, match="distinct chunk metadata values"):
        tier.put(key_of(2), payload_of(2, 1200), meta(1200))
    assert tier.used_bytes == used and tier.meta(key_of(2)) is None
    offset = tier.reserve(1200)
    with pytest.raises(TierFullError, match="distinct chunk metadata values"):
        tier.commit(key_of(2), offset, meta(1200))
    tier.abort(offset)  # the refused commit left its reservation
    assert tier.used_bytes == used
    tier.put(key_of(3), payload_of(3, 1000), meta(1000))  # an equal value shares its id
    assert tier.remove(key_of(1))
    tier.put(key_of(2), payload_of(2, 1200), meta(1200))  # the freed id is reused
    assert torch.equal(_read(tier, key_of(2), 1200), payload_of(2, 1200))  # type: ignore[arg-type]
    assert torch.equal(_read(tier, key_of(0), 1000), payload_of(0, 1000))  # type: ignore[arg-type]
