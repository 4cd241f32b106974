"""`HostBatch`: gets and puts of several CPU chunks through a raw host top tier in one `copy_many`,
with the bytes, the counters, the eviction order and the failures of the per-chunk path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from tests.conftest import make_chunk, store_config
from tiers.byte_copy import copy_many


def _chunks(store: TieredStore, n: int, seed: int) -> tuple[list[bytes], list[torch.Tensor]]:
    tokens = torch.arange(seed * 10_000, seed * 10_000 + n * store.layout.chunk_tokens, dtype=torch.int32)
    return store.chunk_keys(tokens), [make_chunk(store.layout, seed * 1000 + i) for i in range(n)]


def _outs(store: TieredStore, n: int) -> list[torch.Tensor]:
    return [torch.empty(store.layout.chunk_shape, dtype=store.layout.torch_dtype) for _ in range(n)]


def _lru_host_only(layout: KVLayout, chunks: int, *, put_timeout_s: float = 2.0) -> StoreConfig:
    host = TierConfig(kind=TierKind.HOST, capacity_bytes=chunks * layout.chunk_bytes, eviction="lru")
    return StoreConfig(layout=layout, tiers=(host,), model_id="test-model", put_timeout_s=put_timeout_s)


def test_batched_put_and_get_round_trip_and_count_as_per_chunk(small_layout: KVLayout, tmp_path: Path) -> None:
    with TieredStore(store_config(small_layout, tmp_path)) as store:
        keys, chunks = _chunks(store, 4, seed=1)
        result = store.put_many(keys, chunks)
        assert result.ok and result.stored == keys
        assert store.flush(5.0)
        outs = _outs(store, 5)
        assert store.get_many_served([*keys, b"x" * 16], outs) == [TierKind.HOST] * 4 + [None]
        assert all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=False))
        stats = store.stats()
        host, nvme = stats["tiers"]["host"], stats["tiers"]["nvme"]
        assert stats["puts"] == host["puts"] == nvme["puts"] == 4  # every chunk written through below
        assert host["hits"] == 4 and host["bytes_read"] == 4 * small_layout.chunk_bytes
        assert stats["get_hits"] == 4 and stats["get_misses"] == 1


def test_a_held_head_in_a_batch_stays_most_recent(small_layout: KVLayout) -> None:
    """The batch reserves every new chunk before touching the held head, but commits and touches tail
    first as the per-chunk path does: the head ends most recent and outlives the new tail."""
    with TieredStore(_lru_host_only(small_layout, 8)) as store:
        keys, chunks = _chunks(store, 3, seed=2)
        store.put(keys[0], chunks[0])
        fillers, filler_chunks = _chunks(store, 3, seed=3)
        assert store.put_many(fillers, filler_chunks).ok
        assert store.put_many(keys, chunks).ok  # A held; B, C new: recency F3 F2 F1 C B A
        later, later_chunks = _chunks(store, 5, seed=4)
        for key, chunk in zip(later, later_chunks, strict=True):  # 11 chunks for 8 slots: the F's go first
            assert store.put(key, chunk).ok
        assert [store.holds(k) for k in (*fillers, *keys)] == [False] * 3 + [True] * 3
        more, more_chunks = _chunks(store, 2, seed=5)
        for key, chunk in zip(more, more_chunks, strict=True):
            assert store.put(key, chunk).ok
        assert [store.holds(k) for k in keys] == [True, False, False]


def test_a_batch_with_no_room_names_what_it_could_not_store(small_layout: KVLayout) -> None:
    with TieredStore(_lru_host_only(small_layout, 4, put_timeout_s=0.1)) as store:
        pinned, pinned_chunks = _chunks(store, 3, seed=6)
        assert store.put_many(pinned, pinned_chunks).ok and store.pin(pinned) == 3
        keys, chunks = _chunks(store, 2, seed=7)
        result = store.put_many(keys, chunks)
        assert result.stored == [keys[1]] and "host tier is full" in result.not_stored[keys[0]]  # tail first
        assert store.stats()["tiers"]["host"]["used_bytes"] == 4 * small_layout.chunk_bytes
        outs = _outs(store, 1)
        assert store.get(keys[1], outs[0]) and torch.equal(outs[0], chunks[1])


def test_a_failed_batch_copy_aborts_its_reservations(small_layout: KVLayout, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvstore.store.host_batch as host_batch

    def broken(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
        raise RuntimeError("copy failed")

    with TieredStore(_lru_host_only(small_layout, 8)) as store:
        keys, chunks = _chunks(store, 3, seed=8)
        monkeypatch.setattr(host_batch, "copy_many", broken)
        with pytest.raises(RuntimeError, match="copy failed"):
            store.put_many(keys, chunks)
        assert store.stats()["tiers"]["host"]["used_bytes"] == 0 and not any(store.holds(k) for k in keys)


def test_a_slot_gone_underneath_the_index_is_a_miss(small_layout: KVLayout) -> None:
    with TieredStore(_lru_host_only(small_layout, 8)) as store:
        keys, chunks = _chunks(store, 3, seed=9)
        assert store.put_many(keys, chunks).ok
        store.levels[0].tier.remove(keys[1])  # as a tier losing a chunk would
        outs = _outs(store, 3)
        assert store.get_many(keys, outs) == [True, False, True]
        assert torch.equal(outs[0], chunks[0]) and torch.equal(outs[2], chunks[2])
        assert store.stats()["tiers"]["host"]["vanished"] == 1 and not store.holds(keys[1])



def test_a_batch_over_half_the_tier_is_batched_only_into_free_room(small_layout: KVLayout,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Over half the tier the batch would have to evict for itself: chunk by chunk then, tail first."""
    import kvstore.store.host_batch as host_batch

    batches: list[int] = []

    def counted(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
        batches.append(len(dsts))
        copy_many(dsts, srcs)

    monkeypatch.setattr(host_batch, "copy_many", counted)
    with TieredStore(_lru_host_only(small_layout, 4)) as store:
        keys, chunks = _chunks(store, 3, seed=10)
        assert store.put_many(keys, chunks).ok and batches == [3]  # 3 of 4 slots, all free
        for key in keys:
            store.remove(key)
        others, other_chunks = _chunks(store, 2, seed=11)
        assert store.put_many(others, other_chunks).ok and batches == [3, 2]  # half the tier
        assert store.put_many(keys, chunks).ok and batches == [3, 2]  # needs an eviction: per chunk
        assert all(store.holds(k) for k in keys) and store.holds(others[0]) != store.holds(others[1])
