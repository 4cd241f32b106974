"""No compression policy puts a codec on a tier that it makes slower without saying so, and `lz4` is
retired for writing: a tier configured with it writes blosc-lz4 (one warning), old lz4 chunks still read."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from kvstore.chunk_format import ChunkHeader
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from policies.compression import make_codec, make_compression_policy
from policies.compression.measured import calibrate
from policies.compression.profiles import DEFAULT_PROFILES, CodecProfile
from policies.compression.speed_check import (
    DEFAULT_TIER_BANDWIDTH,
    PUT_FLOOR,
    effective_rates,
    fastest_codec,
    slower_than_tier,
)
from tests.conftest import store_config

GB = 1e9


def _nvme_codec_ids(tmp_path: Path) -> set[int]:
    return {ChunkHeader.unpack(path.read_bytes()).codec_id for path in (tmp_path / "nvme").rglob("*.kvc")}


def _put_and_read_back(config: Any, layout: Any) -> None:
    with TieredStore(config) as store:
        keys = store.chunk_keys(list(range(3 * layout.chunk_tokens)))
        gen = torch.Generator().manual_seed(3)
        chunks = [torch.randn(layout.chunk_shape, generator=gen).to(layout.torch_dtype) for _ in keys]
        assert store.put_many(keys, chunks).ok
        store.flush()
        store.drop_tier_copies(TierKind.HOST)
        outs = [store.empty_chunk() for _ in keys]
        assert all(store.get_many(keys, outs))
        assert all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))


def test_a_tier_configured_with_lz4_writes_blosc_lz4_and_says_so_once(small_layout: KVLayout, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = store_config(small_layout, tmp_path)
    tiers = tuple(dataclasses.replace(t, codec="lz4", raw_when_encoder_busy=False) if t.kind is TierKind.NVME else t
                  for t in config.tiers)
    with caplog.at_level(logging.WARNING, logger="policies.compression.registry"):
        _put_and_read_back(dataclasses.replace(config, tiers=tiers), small_layout)
    assert _nvme_codec_ids(tmp_path) == {make_codec("blosc-lz4").codec_id}
    retired = [r.getMessage() for r in caplog.records if "retired" in r.getMessage()]
    assert len(retired) == 1 and "'blosc-lz4'" in retired[0] and "nvme" in retired[0]


def test_a_slow_codec_is_named_with_the_faster_choice() -> None:
    # blosc-zstd encodes below 0.9 of this tier's write; zstd and blosc-lz4 beat the raw tier both ways.
    bandwidth = (1.0 * GB, 1.0 * GB)
    zstd_put = effective_rates(DEFAULT_PROFILES["blosc-zstd"], "blosc-zstd", *bandwidth)[1]
    assert zstd_put < bandwidth[1]
    best = fastest_codec(DEFAULT_PROFILES, *bandwidth)
    assert best in ("zstd", "blosc-lz4")
    for name in ("zstd", "blosc-lz4"):
        assert slower_than_tier("pfs", name, DEFAULT_PROFILES, bandwidth) is None
    message = slower_than_tier("pfs", "blosc-zstd", DEFAULT_PROFILES, bandwidth)
    assert message is not None and f"'{best}' is faster there" in message
    # On a tier faster than every codec, the faster choice is storing raw.
    message = slower_than_tier("nvme", "blosc-lz4", DEFAULT_PROFILES, (20 * GB, 20 * GB))
    assert message is not None and "'none' is faster there" in message
    assert slower_than_tier("pfs", "blosc-lz4", DEFAULT_PROFILES, (0.2 * GB, 0.2 * GB)) is None


def test_a_codec_wins_with_a_faster_get_and_a_put_within_the_floor() -> None:
    """A codec whose get beats the raw read wins while its put keeps PUT_FLOOR of the raw write, not below."""
    profile = {"zstd": CodecProfile(ratio=1.5, encode_bytes_per_s=0.95 * GB, decode_bytes_per_s=3 * GB)}
    assert fastest_codec(profile, 1.0 * GB, 1.0 * GB) == "zstd"  # get 1.5, put 0.95 of 1.0
    assert slower_than_tier("nvme", "zstd", profile, (1.0 * GB, 1.0 * GB)) is None
    assert fastest_codec(profile, 1.0 * GB, 0.95 * GB / (PUT_FLOOR - 0.01)) == "none"  # put just below the floor
    assert fastest_codec(profile, 3.0 * GB, 1.0 * GB) == "none"  # get 3.0 (the decode) does not beat a 3.0 read


def test_static_policy_warns_for_a_configured_codec_slower_than_its_tier(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="policies.compression.speed_check"):
        fast = make_compression_policy("static", tier_codecs={"nvme": "blosc-zstd"},
                                       tier_bandwidth={"nvme": (20 * GB, 20 * GB)})
        slow = make_compression_policy("static", tier_codecs={"nvme": "blosc-zstd"},
                                       tier_bandwidth={"nvme": (0.1 * GB, 0.1 * GB)})
    assert fast.codec_for("nvme") == "blosc-zstd"  # kept, since the config asked for it
    assert len(fast.warnings) == 1 and "'none' is faster there" in fast.warnings[0]  # type: ignore[attr-defined]
    assert slow.warnings == []  # type: ignore[attr-defined]
    assert [r.getMessage() for r in caplog.records] == fast.warnings  # type: ignore[attr-defined]
    assert make_compression_policy("static").warnings == []  # type: ignore[attr-defined]  # the defaults pass their own check


def test_a_store_with_only_fixed_codecs_still_warns(small_layout: KVLayout, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = store_config(small_layout, tmp_path)
    tiers = tuple(dataclasses.replace(t, codec="blosc-zstd", read_bytes_per_s=1e14) if t.kind is TierKind.NVME else t
                  for t in config.tiers)
    with caplog.at_level(logging.WARNING, logger="policies.compression.speed_check"):
        TieredStore(dataclasses.replace(config, tiers=tiers)).close()
    assert any("tier nvme" in r.getMessage() and "'none' is faster" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("allow_lossy", [False, True])
def test_utility_never_picks_a_codec_that_slows_its_tier(allow_lossy: bool) -> None:
    rates_gbps = (0.05, 0.2, 0.7, 1.0, 1.6, 2.4, 5.0, 20.0)
    for read, write in itertools.product(rates_gbps, repeat=2):
        policy = make_compression_policy("utility", allow_lossy=allow_lossy,
                                         tier_bandwidth={"pfs": (read * GB, write * GB)})
        for reuse in (0.1, 0.5, 0.9):
            codec = policy.codec_for("pfs", reuse)
            get, put = effective_rates(policy.profiles[codec], codec, read * GB, write * GB)  # type: ignore[attr-defined]
            assert get >= read * GB and put >= write * GB, (codec, read, write, reuse)
            assert codec != "lz4"  # retired for writing


def test_measured_policy_with_real_calibration_picks_blosc_lz4_for_a_slow_tier_and_none_for_a_fast_one(
        small_layout: KVLayout) -> None:
    profiles = calibrate(small_layout, ("none", "blosc-lz4"), repeats=3)
    lz4 = profiles["blosc-lz4"]
    assert lz4.ratio > 1.0  # bf16 exponents compress
    # A tier slower than blosc-lz4's speeds / its ratio moves more KV per second through it.
    slow = 0.8 * min(lz4.encode_bytes_per_s, lz4.decode_bytes_per_s) / lz4.ratio
    # A tier faster than the codec's decode and encode: storing raw is fastest.
    fast = 2 * max(lz4.encode_bytes_per_s, lz4.decode_bytes_per_s)
    policy = make_compression_policy("measured", profiles=profiles,
                                     tier_bandwidth={"pfs": (slow, slow), "nvme": (fast, fast)})
    assert policy.codec_for("pfs") == "blosc-lz4"
    assert policy.codec_for("nvme") == "none"
    assert policy.choices["pfs"].get_bytes_per_s > slow and policy.choices["pfs"].put_bytes_per_s >= slow  # type: ignore[attr-defined]


@pytest.mark.parametrize(("setting", "warned"), [("auto", False), (True, False), (False, True)])
def test_a_tier_that_stores_raw_under_busy_encoders_is_judged_by_its_get(
        small_layout: KVLayout, tmp_path: Path, caplog: pytest.LogCaptureFixture, setting: bool | Literal["auto"], warned: bool) -> None:
    """zstd on the default NVMe figures: its get beats the read, its put alone would not keep 0.9 of the write.
    A tier that passes chunks on raw when its encoders are busy keeps the disk's pace, so only `false` warns."""
    read, write = DEFAULT_TIER_BANDWIDTH["nvme"]
    get, put = effective_rates(DEFAULT_PROFILES["zstd"], "zstd", read, write)
    assert get > read and put < PUT_FLOOR * write
    assert slower_than_tier("nvme", "zstd", DEFAULT_PROFILES, (read, write), overflow=True) is None
    config = store_config(small_layout, tmp_path)
    tiers = tuple(dataclasses.replace(t, codec="zstd", raw_when_encoder_busy=setting) if t.kind is TierKind.NVME else t
                  for t in config.tiers)
    with caplog.at_level(logging.WARNING, logger="policies.compression.speed_check"):
        TieredStore(dataclasses.replace(config, tiers=tiers)).close()
    said = [r.getMessage() for r in caplog.records if "tier nvme: codec 'zstd' makes it slower" in r.getMessage()]
    assert len(said) == int(warned)
