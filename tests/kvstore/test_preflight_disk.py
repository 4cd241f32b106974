"""Disk tiers against the free space of their filesystem (kvstore/preflight.py: check_disk_space)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from kvstore.config import StoreConfig, TierConfig
from kvstore.errors import ConfigError
from kvstore.layout import KVLayout
from kvstore.preflight import check_disk_space
from kvstore.types import TierKind

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=16, chunk_tokens=16)


def _free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _config(*tiers: TierConfig) -> StoreConfig:
    return StoreConfig(layout=LAYOUT, tiers=(TierConfig(kind=TierKind.HOST, capacity_bytes=1 << 20), *tiers))


def test_a_disk_tier_larger_than_its_filesystem_is_refused_with_the_figures(tmp_path: Path) -> None:
    """Regression (issue 25): NVMe 2 TiB and PFS 20 TiB were accepted on a disk with 71 GB free."""
    too_big = _free_bytes(tmp_path) * 2
    config = _config(TierConfig(kind=TierKind.NVME, capacity_bytes=too_big, path=str(tmp_path / "nvme")))
    with pytest.raises(ConfigError, match=r"tier nvme \(.*\): capacity .* does not fit on disk: the filesystem of "
                                          rf"'{tmp_path}' has .* free; lower capacity to at most .* or choose a path"):
        check_disk_space(config)


def test_two_tiers_on_one_filesystem_are_counted_together(tmp_path: Path) -> None:
    half = int(_free_bytes(tmp_path) * 0.6)
    config = _config(TierConfig(kind=TierKind.NVME, capacity_bytes=half, path=str(tmp_path / "nvme")),
                     TierConfig(kind=TierKind.PFS, capacity_bytes=half, path=str(tmp_path / "pfs")))
    with pytest.raises(ConfigError, match=r"tier nvme .* \+ tier pfs .*: capacity .* does not fit on disk"):
        check_disk_space(config)


def test_past_ninety_percent_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    near = int(_free_bytes(tmp_path) * 0.95)
    config = _config(TierConfig(kind=TierKind.NVME, capacity_bytes=near, path=str(tmp_path / "nvme")))
    with caplog.at_level(logging.WARNING, logger="kvstore.preflight"):
        check_disk_space(config)
    assert any("of the room on disk" in r.getMessage() for r in caplog.records)


def test_a_small_tier_passes_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = _config(TierConfig(kind=TierKind.NVME, capacity_bytes=1 << 20, path=str(tmp_path / "a" / "b")))
    with caplog.at_level(logging.WARNING, logger="kvstore.preflight"):
        check_disk_space(config)
    assert not caplog.records


def test_bytes_kvstore_already_holds_count_as_room(tmp_path: Path) -> None:
    folder = tmp_path / "nvme"
    folder.mkdir()
    held = 128 << 20
    with open(folder / "chunks.bin", "wb") as file:
        file.write(os.urandom(1 << 20) * 128)
    exactly = _free_bytes(tmp_path) + held // 2  # more than free, less than free + held
    check_disk_space(_config(TierConfig(kind=TierKind.NVME, capacity_bytes=exactly, path=str(folder))))
