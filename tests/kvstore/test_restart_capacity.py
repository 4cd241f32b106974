"""A store reopened with less room than its config gives: capped tiers (kvstore/capacity_caps.py) evict
down to their effective capacity through their policy at recovery, every chunk kept reads back
identical, and stats carry both capacities; a host tier larger than the memory now is capped at a
restart (a disk tier holds chunks) and refused at a first start (kvstore/preflight.py)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch

from kvstore.capacity_caps import CapacityCap
from kvstore.config import StoreConfig
from kvstore.errors import ConfigError
from kvstore.layout import KVLayout
from kvstore.preflight import MachineMemory, check_memory
from kvstore.store import TieredStore
from kvstore.types import TierKind
from tests.conftest import make_chunk, store_config

NUM_CHUNKS = 20
MiB = 1 << 20


def _fill(config: StoreConfig) -> tuple[list[bytes], list[torch.Tensor]]:
    """A first run: NUM_CHUNKS chunks written through to the NVMe tier, then the store closed."""
    with TieredStore(config) as store:
        tokens = torch.arange(NUM_CHUNKS * config.layout.chunk_tokens, dtype=torch.int32)
        keys = store.chunk_keys(tokens)
        chunks = [make_chunk(config.layout, i) for i in range(len(keys))]
        for key, chunk in zip(keys, chunks, strict=True):  # one put each: no chain, each its own entry
            assert store.put(key, chunk).ok
        store.flush()
        assert store.stats()["tiers"]["nvme"]["chunks"] == NUM_CHUNKS
    return keys, chunks


def _file_bytes(folder: Path) -> int:
    """The size of one chunk file in `folder` (each one the same: one layout, no codec)."""
    return next(folder.rglob("*.kvc")).stat().st_size


def _read_all(store: TieredStore, keys: list[bytes], chunks: list[torch.Tensor]) -> int:
    """How many chunks read back; each one read must be identical to what was put."""
    hits = 0
    for key, chunk in zip(keys, chunks, strict=True):
        out = store.empty_chunk()
        if store.get(key, out):
            assert torch.equal(out, chunk), "a chunk kept after the cap reads back different bytes"
            hits += 1
    return hits


def test_a_capped_disk_tier_evicts_down_to_its_effective_capacity(small_layout: KVLayout, tmp_path: Path) -> None:
    config = store_config(small_layout, tmp_path, host_chunks=2, nvme_chunks=64)
    keys, chunks = _fill(config)
    nvme = config.tier(TierKind.NVME)
    assert nvme is not None
    footprint = _file_bytes(tmp_path / "nvme")
    effective = 7 * footprint + footprint // 2  # room for 7 chunk files and a half
    cap = CapacityCap(kind=TierKind.NVME, configured_bytes=nvme.capacity_bytes, effective_bytes=effective,
                      free_bytes=0, held_bytes=NUM_CHUNKS * footprint, where=str(tmp_path), rule="test")
    with TieredStore(config, caps=[cap]) as store:
        tier = store.stats()["tiers"]["nvme"]
        assert tier["capacity_bytes"] == effective and tier["configured_capacity_bytes"] == nvme.capacity_bytes
        assert tier["used_bytes"] <= effective
        assert tier["chunks"] == 7, "evicted more (or fewer) than the cap asks"
        assert tier["evictions"] == NUM_CHUNKS - 7
        assert len(list((tmp_path / "nvme").rglob("*.kvc"))) == 7  # the evicted files are gone from the disk
        assert _read_all(store, keys, chunks) == 7  # every chunk that fits is readable, identical


def test_a_capped_tier_demotes_its_victims_to_the_tier_below(small_layout: KVLayout, tmp_path: Path) -> None:
    """With a PFS tier below that holds no copy (replicate_to: NVMe only), what the cap evicts from
    NVMe is demoted, as a full tier's victims are: every chunk still reads back."""
    config = store_config(small_layout, tmp_path, host_chunks=2, nvme_chunks=64, pfs_chunks=64,
                          replicate_to=(TierKind.NVME,))
    keys, chunks = _fill(config)
    nvme = config.tier(TierKind.NVME)
    assert nvme is not None
    footprint = _file_bytes(tmp_path / "nvme")
    cap = CapacityCap(kind=TierKind.NVME, configured_bytes=nvme.capacity_bytes, effective_bytes=5 * footprint,
                      free_bytes=0, held_bytes=NUM_CHUNKS * footprint, where=str(tmp_path), rule="test")
    with TieredStore(config, caps=[cap]) as store:
        tiers = store.stats()["tiers"]
        assert tiers["nvme"]["chunks"] == 5 and tiers["nvme"]["demotions"] == NUM_CHUNKS - 5
        assert tiers["pfs"]["chunks"] == NUM_CHUNKS - 5
        assert _read_all(store, keys, chunks) == NUM_CHUNKS


def test_a_capacity_lowered_in_the_config_evicts_down_too(small_layout: KVLayout, tmp_path: Path) -> None:
    keys, chunks = _fill(store_config(small_layout, tmp_path, host_chunks=2, nvme_chunks=64))
    lowered = store_config(small_layout, tmp_path, host_chunks=2, nvme_chunks=8)
    with TieredStore(lowered) as store:
        tier = store.stats()["tiers"]["nvme"]
        assert tier["capacity_bytes"] == tier["configured_capacity_bytes"]  # no cap: both the config's
        assert tier["used_bytes"] <= tier["capacity_bytes"] and tier["chunks"] > 0
        assert _read_all(store, keys, chunks) == tier["chunks"]


def _host_config(small_layout: KVLayout, tmp_path: Path) -> StoreConfig:
    """A 256 MiB host tier above a small NVMe tier."""
    config = store_config(small_layout, tmp_path, host_chunks=2, nvme_chunks=16)
    host = dataclasses.replace(config.tiers[0], capacity_bytes=256 * MiB)
    return dataclasses.replace(config, tiers=(host, *config.tiers[1:]))


def test_a_host_tier_larger_than_the_memory_now_is_capped_at_a_restart(
        small_layout: KVLayout, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = _host_config(small_layout, tmp_path)
    memory = MachineMemory(available_bytes=96 * MiB, shm_free_bytes=1 << 40)  # this machine's figures, now
    with pytest.raises(ConfigError, match=r"tier host: capacity = 256.0 MiB does not fit this machine: available RAM"):
        check_memory(config, headroom_bytes=32 * MiB, memory=memory)  # a first start: nothing held, refused
    _fill(store_config(small_layout, tmp_path, host_chunks=2, nvme_chunks=16))  # the NVMe tier now holds chunks
    with caplog.at_level(logging.WARNING, logger="kvstore.preflight"):
        caps = check_memory(config, headroom_bytes=32 * MiB, memory=memory)
    assert [(c.kind, c.configured_bytes, c.effective_bytes) for c in caps] == [(TierKind.HOST, 256 * MiB, 64 * MiB)]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "256.0 MiB" in lines[0] and "64.0 MiB" in lines[0] and "96.0 MiB" in lines[0], lines
    with TieredStore(config, caps=caps) as store:
        host = store.stats()["tiers"]["host"]
        assert host["capacity_bytes"] == 64 * MiB and host["configured_capacity_bytes"] == 256 * MiB
        assert store.levels[0].tier.capacity_bytes == 64 * MiB  # the arena itself is the capped size


def test_a_host_tier_that_would_hold_no_chunk_is_refused_at_a_restart_too(small_layout: KVLayout, tmp_path: Path) -> None:
    config = _host_config(small_layout, tmp_path)
    _fill(store_config(small_layout, tmp_path, host_chunks=2, nvme_chunks=16))
    memory = MachineMemory(available_bytes=32 * MiB + small_layout.chunk_bytes - 1, shm_free_bytes=1 << 40)
    with pytest.raises(ConfigError, match="MemAvailable"):
        check_memory(config, headroom_bytes=32 * MiB, memory=memory)
