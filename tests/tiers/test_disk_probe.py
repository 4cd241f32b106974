"""The disk probe behind `compression = "measured"`: bounded in bytes and time, leaves nothing behind, probes a
folder once per process, and its figures (not the default device's) are what the measured policy weighs."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from policies.compression.speed_check import DEFAULT_TIER_BANDWIDTH
from tests.conftest import store_config
from tiers import disk_probe
from tiers.disk_probe import BLOCK_BYTES, MIN_BLOCKS, probe_disk


def test_a_probe_measures_within_its_byte_bound_and_removes_its_file(tmp_path: Path) -> None:
    folder = tmp_path / "not-yet-made"
    speed = probe_disk(str(folder), max_bytes=4 * BLOCK_BYTES)
    assert speed.read_bytes_per_s > 0 and speed.write_bytes_per_s > 0
    assert MIN_BLOCKS * BLOCK_BYTES <= speed.probed_bytes <= 4 * BLOCK_BYTES
    assert list(folder.iterdir()) == [], "the probe file is deleted"
    assert probe_disk(str(folder)) is speed, "a folder is probed once per process"
    assert probe_disk(str(folder / ".." / "not-yet-made")) is speed, "cached by the folder's real path"


def test_the_time_budget_bounds_a_probe_whose_byte_bound_is_out_of_reach(tmp_path: Path) -> None:
    speed = probe_disk(str(tmp_path), max_bytes=1 << 40, budget_s=0.05)  # 1 TiB: no disk here writes it in 25 ms
    assert MIN_BLOCKS * BLOCK_BYTES <= speed.probed_bytes < 1 << 40


def test_the_measured_policy_weighs_codecs_against_the_probed_disk(small_layout: KVLayout, tmp_path: Path) -> None:
    """Regression: with no bandwidth in the config, `measured` used the default NVMe figures (1.6 / 2.4 GB/s)
    whatever the disk, and kept choosing `none`."""
    config = store_config(small_layout, tmp_path, compression="measured")
    tiers = tuple(dataclasses.replace(t, codec="auto") if t.kind is TierKind.NVME else t for t in config.tiers)
    with TieredStore(dataclasses.replace(config, tiers=tiers)) as store:
        probed = probe_disk(str(tmp_path / "nvme"))  # the cached probe the store made at start
        assert store.compression is not None
        bandwidth = store.compression.bandwidth  # type: ignore[attr-defined]
        assert bandwidth["nvme"] == (probed.read_bytes_per_s, probed.write_bytes_per_s)
        assert bandwidth["nvme"] != DEFAULT_TIER_BANDWIDTH["nvme"]
        choice = store.compression.choose("nvme")  # type: ignore[attr-defined]
        assert choice.raw_read_bytes_per_s == probed.read_bytes_per_s


def test_a_bandwidth_in_the_config_wins_over_the_probe(small_layout: KVLayout, tmp_path: Path) -> None:
    config = store_config(small_layout, tmp_path, compression="measured")
    tiers = tuple(dataclasses.replace(t, codec="auto", read_bytes_per_s=3e9, write_bytes_per_s=2e9)
                  if t.kind is TierKind.NVME else t for t in config.tiers)
    with TieredStore(dataclasses.replace(config, tiers=tiers)) as store:
        assert store.compression.bandwidth["nvme"] == (3e9, 2e9)  # type: ignore[union-attr]
        assert os.path.realpath(tmp_path / "nvme") not in disk_probe._cache, "no probe when the config says"
