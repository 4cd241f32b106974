"""Disk tiers against the free space of their filesystem (kvstore/preflight.py: check_disk_space): refused at a
first start, capped at a restart (a tier folder holds chunk files), on this machine's real filesystem."""

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
from kvstore.units import format_bytes

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=16, chunk_tokens=16)


def _free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _chunk_file(folder: Path, nbytes: int = 1 << 20) -> int:
    """A file named as a chunk file in `folder` (preflight reads names and sizes only); its disk bytes."""
    path = folder / "ab" / "cd" / ("abcd" + "0" * 28 + ".kvc")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x01" * nbytes)
    return os.stat(path).st_blocks * 512


def _offered_when_empty(path: Path) -> int:
    stat = os.statvfs(path)
    return (stat.f_blocks - (stat.f_bfree - stat.f_bavail)) * stat.f_frsize


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
    held = _chunk_file(folder, 128 << 20)
    exactly = _free_bytes(tmp_path) + held // 2  # more than free, less than free + held
    check_disk_space(_config(TierConfig(kind=TierKind.NVME, capacity_bytes=exactly, path=str(folder))))


def test_other_files_in_the_folder_are_not_room(tmp_path: Path) -> None:
    """Another process's file in the tier's folder is not kvstore's to free: it does not count as held."""
    folder = tmp_path / "nvme"
    folder.mkdir()
    with open(folder / "other.bin", "wb") as file:
        file.write(os.urandom(1 << 20) * 128)
    config = _config(TierConfig(kind=TierKind.NVME, capacity_bytes=_free_bytes(tmp_path) + (64 << 20),
                                path=str(folder)))
    with pytest.raises(ConfigError, match="does not fit on disk"):
        check_disk_space(config)


def test_a_restart_that_no_longer_fits_starts_capped_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Regression (issue 43): a daemon whose filesystem another process filled was refused at its restart."""
    folder = tmp_path / "nvme"
    held = _chunk_file(folder)
    wanted = _free_bytes(tmp_path) + held + (256 << 20)  # past free + held, with room for other writers' drift
    if wanted > _offered_when_empty(tmp_path):
        pytest.skip("this filesystem is nearly empty: the capacity would not fit it even empty")
    config = _config(TierConfig(kind=TierKind.NVME, capacity_bytes=wanted, path=str(folder)))
    with caplog.at_level(logging.WARNING, logger="kvstore.preflight"):
        caps = check_disk_space(config)
    assert len(caps) == 1
    cap = caps[0]
    assert cap.kind is TierKind.NVME and cap.configured_bytes == wanted and cap.held_bytes == held
    assert cap.effective_bytes == int(0.9 * (cap.free_bytes + cap.held_bytes)) < wanted  # the documented rule
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(folder) in lines[0], lines
    assert all(format_bytes(n) in lines[0] for n in (wanted, cap.effective_bytes, cap.free_bytes, held)), lines[0]


def test_a_first_start_that_does_not_fit_is_still_refused(tmp_path: Path) -> None:
    """Files that are not chunks (a lock file, anything else) do not make a start a restart."""
    folder = tmp_path / "nvme"
    folder.mkdir()
    (folder / ".kvstore.lock").write_text("12345\n")
    wanted = _free_bytes(tmp_path) + (256 << 20)
    config = _config(TierConfig(kind=TierKind.NVME, capacity_bytes=wanted, path=str(folder)))
    with pytest.raises(ConfigError, match="does not fit on disk"):
        check_disk_space(config)


def test_a_capacity_no_empty_filesystem_could_hold_is_refused_at_a_restart_too(tmp_path: Path) -> None:
    folder = tmp_path / "nvme"
    _chunk_file(folder)
    wanted = _offered_when_empty(tmp_path) + (1 << 30)
    config = _config(TierConfig(kind=TierKind.NVME, capacity_bytes=wanted, path=str(folder)))
    with pytest.raises(ConfigError, match=r"does not fit on disk: .*\(even empty it offers only .*refused at a restart too\)"):
        check_disk_space(config)


def test_tiers_sharing_a_filesystem_share_the_cap_by_capacity(tmp_path: Path) -> None:
    held = _chunk_file(tmp_path / "nvme")
    total = _free_bytes(tmp_path) + held + (512 << 20)
    if total > _offered_when_empty(tmp_path):
        pytest.skip("this filesystem is nearly empty: the capacity would not fit it even empty")
    config = _config(TierConfig(kind=TierKind.NVME, capacity_bytes=total // 4, path=str(tmp_path / "nvme")),
                     TierConfig(kind=TierKind.PFS, capacity_bytes=total - total // 4, path=str(tmp_path / "pfs")))
    nvme, pfs = check_disk_space(config)
    assert nvme.kind is TierKind.NVME and pfs.kind is TierKind.PFS
    assert nvme.effective_bytes + pfs.effective_bytes <= 0.9 * (nvme.free_bytes + held)
    assert 2.9 < pfs.effective_bytes / nvme.effective_bytes < 3.1  # in proportion to the configured capacities
