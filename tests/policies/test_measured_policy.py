"""The `measured` compression policy: a codec goes on a tier only where its measured speeds make that
tier faster (or larger at a bounded read cost), decided from calibration on real chunks."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.chunk_format import ChunkHeader
from kvstore.errors import ConfigError
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from policies.compression import make_codec, make_compression_policy
from policies.compression.measured import MeasuredCompressionPolicy, calibrate, effective_rates
from policies.compression.policy import CodecProfile
from tests.conftest import store_config

PROFILES = {  # a fast lz4-like codec, a slow high-ratio one
    "none": CodecProfile(ratio=1.0, encode_bytes_per_s=1e12, decode_bytes_per_s=1e12),
    "blosc-lz4": CodecProfile(ratio=1.25, encode_bytes_per_s=8e9, decode_bytes_per_s=12e9),
    "zstd": CodecProfile(ratio=1.45, encode_bytes_per_s=0.6e9, decode_bytes_per_s=1.0e9),
}


def _policy(**options: Any) -> Any:
    return make_compression_policy("measured", profiles=PROFILES, **options)


def test_a_codec_goes_only_where_it_makes_the_tier_faster() -> None:
    policy = _policy(tier_bandwidth={"nvme": (1.6e9, 2.4e9), "host": (2e10, 2e10), "pfs": (0.2e9, 0.2e9)})
    assert policy.codec_for("host") == "none"  # memory is faster than any decode
    assert policy.codec_for("nvme") == "blosc-lz4"  # zstd's decode is slower than the disk's read
    assert policy.codec_for("pfs") == "zstd"  # a slow tier: the better ratio wins
    for tier in ("nvme", "pfs"):
        choice = policy.choices[tier]
        assert choice.get_bytes_per_s > choice.raw_read_bytes_per_s
        assert choice.put_bytes_per_s >= choice.raw_write_bytes_per_s


def test_capacity_objective_takes_the_best_ratio_above_the_read_floor() -> None:
    bandwidth = {"nvme": (1.6e9, 2.4e9)}
    assert _policy(tier_bandwidth=bandwidth, objective="capacity", min_get_fraction=0.5).codec_for("nvme") == "zstd"
    assert _policy(tier_bandwidth=bandwidth, objective="capacity", min_get_fraction=0.9).codec_for("nvme") == "blosc-lz4"


def test_effective_rates_are_never_above_either_stage() -> None:
    overlapped = effective_rates(PROFILES["blosc-lz4"], "blosc-lz4", 1.6e9, 2.4e9)
    serial = effective_rates(PROFILES["blosc-lz4"], "blosc-lz4", 1.6e9, 2.4e9, overlapped=False)
    assert overlapped == (min(12e9, 1.25 * 1.6e9), min(8e9, 1.25 * 2.4e9))
    assert serial[0] < overlapped[0] and serial[1] < overlapped[1]


def test_bad_options_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="'throughput' or 'capacity'"):
        _policy(objective="speed")
    with pytest.raises(ConfigError, match="layout"):
        make_compression_policy("measured")


def test_calibration_measures_real_codecs(small_layout: KVLayout) -> None:
    profiles = calibrate(small_layout, ("none", "blosc-lz4"), repeats=1)
    assert set(profiles) == {"none", "blosc-lz4"}
    assert all(p.encode_bytes_per_s > 0 and p.decode_bytes_per_s > 0 for p in profiles.values())
    assert profiles["none"].ratio == 1.0 and profiles["blosc-lz4"].ratio > 1.0  # bf16/fp16 exponents compress


@pytest.mark.parametrize("read_bytes_per_s,compressed", [(1e5, True), (1e14, False)])
def test_store_compresses_its_disk_tier_only_when_the_tier_is_slower_than_the_codec(
        small_layout: KVLayout, tmp_path: Path, read_bytes_per_s: float, compressed: bool) -> None:
    config = store_config(small_layout, tmp_path, compression="measured")
    tiers = tuple(dataclasses.replace(t, codec="auto", read_bytes_per_s=read_bytes_per_s)
                  if t.kind is TierKind.NVME else t for t in config.tiers)
    with TieredStore(dataclasses.replace(config, tiers=tiers)) as store:
        keys = store.chunk_keys(list(range(4 * small_layout.chunk_tokens)))
        gen = torch.Generator().manual_seed(0)
        chunks = [torch.randn(small_layout.chunk_shape, generator=gen).to(small_layout.torch_dtype) for _ in keys]
        assert store.put_many(keys, chunks).ok
        store.flush()
        store.drop_tier_copies(TierKind.HOST)
        codec_ids = {ChunkHeader.unpack(path.read_bytes()).codec_id for path in (tmp_path / "nvme").rglob("*.kvc")}
        lossless_ids = {make_codec("blosc-lz4").codec_id, make_codec("zstd").codec_id}
        assert codec_ids and (codec_ids <= lossless_ids if compressed else codec_ids == {0})
        outs = [store.empty_chunk() for _ in keys]
        assert all(store.get_many(keys, outs))
        assert all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))


def test_a_tier_that_stores_raw_under_busy_encoders_takes_a_codec_whose_get_wins() -> None:
    """A codec that reads faster than the disk but encodes slower than it writes: `none` for a tier that would
    wait on its encoders, the codec for one that passes chunks on raw when they are busy (the default "auto"),
    whose puts keep the disk's pace anyway."""
    profiles = {"zstd": CodecProfile(ratio=1.5, encode_bytes_per_s=1e9, decode_bytes_per_s=4e9)}
    bandwidth = {"nvme": (2e9, 2e9)}
    waits = MeasuredCompressionPolicy(profiles=profiles, tier_bandwidth=bandwidth)
    passes = MeasuredCompressionPolicy(profiles=profiles, tier_bandwidth=bandwidth, overflow_tiers={"nvme"})
    assert waits.codec_for("nvme") == "none"
    assert passes.codec_for("nvme") == "zstd"
    assert "puts at the disk's pace" in passes.choices["nvme"].reason
    assert passes.choices["nvme"].get_bytes_per_s == 3e9  # min(decode 4, ratio 1.5 x read 2)
