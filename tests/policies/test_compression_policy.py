"""Compression policies: codec per tier and chunk; compress-in-place vs demote vs drop by utility."""

from __future__ import annotations

import pytest

from kvstore.errors import ConfigError, UnknownPolicyError
from policies.compression import make_compression_policy
from policies.compression.policy import DEFAULT_PROFILES, ChunkState

MIB = 1 << 20


def test_registry_and_lossy_is_off_by_default() -> None:
    with pytest.raises(UnknownPolicyError, match="static, utility"):
        make_compression_policy("magic")
    with pytest.raises(ConfigError, match="allow_lossy"):
        make_compression_policy("static", tier_codecs={"nvme": "int8"})
    with pytest.raises(ConfigError, match="allow_lossy"):
        make_compression_policy("utility", tier_codecs={"host": "fp8"})
    assert make_compression_policy("static", tier_codecs={"nvme": "int8"}, allow_lossy=True).codec_for("nvme") == "int8"
    utility = make_compression_policy("utility")
    for tier in ("gpu", "host", "nvme", "pfs", "redis"):
        for reuse in (0.0, 0.5, 1.0):
            assert utility.codec_for(tier, reuse) in ("none", "blosc-lz4", "zstd")  # never a retired one


def test_static_uses_the_tier_table() -> None:
    policy = make_compression_policy("static")
    assert (policy.codec_for("host"), policy.codec_for("nvme"), policy.codec_for("pfs")) == ("none", "none", "zstd")


def test_utility_picks_raw_for_fast_tiers_and_the_best_ratio_for_slow_ones() -> None:
    policy = make_compression_policy("utility", tier_read_bytes_per_s={"pfs": 2e8})
    assert policy.codec_for("host", reuse_probability=0.9) == "none"  # decode slower than a memory read
    best = max(("blosc-lz4", "zstd"), key=lambda name: DEFAULT_PROFILES[name].ratio)
    assert policy.codec_for("pfs", reuse_probability=0.9) == best  # fewer bytes over a slow link pays
    assert policy.codec_for("pfs", reuse_probability=0.0) == "none"  # never read again: do not bother


def test_utility_compresses_a_hot_chunk_in_place_but_drops_a_cold_one() -> None:
    policy = make_compression_policy("utility", allow_lossy=True)
    hot = ChunkState(raw_bytes=4 * MIB, stored_bytes=4 * MIB, reuse_probability=0.9, recompute_s=0.5)
    decision = policy.on_pressure("host", hot)
    assert decision.action == "compress" and decision.codec in ("int8", "fp8", "blosc-lz4", "zstd")
    cold = ChunkState(raw_bytes=4 * MIB, stored_bytes=4 * MIB, reuse_probability=0.0, recompute_s=0.5)
    assert policy.on_pressure("host", cold).action == "drop"


def test_utility_demotes_when_a_fast_tier_is_below_and_lossy_is_off() -> None:
    policy = make_compression_policy("utility")
    chunk = ChunkState(raw_bytes=4 * MIB, stored_bytes=4 * MIB, reuse_probability=0.8, has_lower_copy=True,
                       lower_read_bytes_per_s=3e9, recompute_s=0.5)
    decision = policy.on_pressure("host", chunk)
    assert decision.action in ("demote", "drop") and decision.bytes_freed == 4 * MIB
    assert decision.codec is None


def test_observe_moves_the_ratio_estimate() -> None:
    policy = make_compression_policy("utility")
    before = policy.profiles["blosc-lz4"].ratio  # type: ignore[attr-defined]
    for _ in range(200):
        policy.observe("blosc-lz4", raw_bytes=100, stored_bytes=50)  # type: ignore[attr-defined]
    assert before < policy.profiles["blosc-lz4"].ratio <= 2.0  # type: ignore[attr-defined]
