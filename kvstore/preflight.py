"""Start-up checks of a StoreConfig against this machine, run before anything is allocated or created.

Each failure is a ConfigError of one line naming the tier, the field, the value and the fix: tier
paths (under a file, in a missing folder, not writable, read-only), memory: the memory tiers
against the RAM this machine has available (MemAvailable) and a shared-memory arena against the
room in /dev/shm, each keeping `headroom_bytes` free; and disk: the disk tiers on one filesystem
together against its free space (plus what kvstore already holds there), refused past it and
warned past 90%. These need neither the tier nor the policy registries (nor torch, but for a GPU
tier's device memory), so `kvstore serve`, `kvstore stats` and `kvstore store-demo` run them first
and a config too large for the machine fails in milliseconds instead of being touched page by page
until the kernel's OOM killer fires; the checks against the registries (names, options, directory
locks) follow, on the store's floor (kvstore/store/config_checks.py).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from kvstore.config import StoreConfig, TierConfig
from kvstore.errors import ConfigError
from kvstore.types import TierKind
from kvstore.units import format_bytes

DEFAULT_HEADROOM_BYTES = 1 << 30
SHM_DIR = "/dev/shm"
LOCAL_DIR_KINDS = (TierKind.NVME,)  # PFS directories are shared between nodes by design
DISK_WARN_SHARE = 0.9
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MachineMemory:
    """What this machine can give: available RAM and the free room of the shared-memory filesystem."""

    available_bytes: int
    shm_free_bytes: int

    @classmethod
    def read(cls, meminfo: str = "/proc/meminfo", shm_dir: str = SHM_DIR) -> MachineMemory:
        available = _meminfo_bytes(meminfo, "MemAvailable")
        try:
            stat = os.statvfs(shm_dir)
            shm_free = stat.f_bavail * stat.f_frsize
        except OSError:
            shm_free = 0
        return cls(available_bytes=available, shm_free_bytes=shm_free)


def check_machine(config: StoreConfig, *, headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
                  creatable_under: Path | None = None, memory: MachineMemory | None = None,
                  shm_dir: str = SHM_DIR) -> None:
    """Memory, every tier's path, then disk space; raises the first failure as a one-line ConfigError."""
    check_memory(config, headroom_bytes=headroom_bytes, memory=memory or MachineMemory.read(shm_dir=shm_dir),
                 shm_dir=shm_dir)
    for tier in config.tiers:
        check_path(tier, creatable_under)
    check_disk_space(config)


def check_path(tier: TierConfig, creatable_under: Path | None) -> None:
    """A disk tier's directory: an existing writable folder, or a new one in an existing folder."""
    if tier.kind not in (TierKind.NVME, TierKind.PFS) or not tier.path:
        return
    path = Path(tier.path).expanduser().absolute()
    where = f"tier {tier.kind.value}: path = '{tier.path}'"
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"{where} lies under '{parent}', which is a file, not a folder; "
                              "choose a path in a folder")
    if path.is_dir():
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            raise ConfigError(f"{where} is on a read-only filesystem (EROFS); remount it read-write "
                              "or choose another path")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{where} is not writable by this user (uid {os.getuid()}); "
                              "fix its permissions or choose another path")
        return
    under_cache = creatable_under is not None and path.is_relative_to(creatable_under.absolute())
    if not path.parent.is_dir() and not under_cache:
        raise ConfigError(f"{where}: the folder '{path.parent}' does not exist (is the disk mounted?); "
                          f"create it (mkdir -p {path.parent}) or choose another path")
    existing = next(p for p in path.parents if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{where} cannot be created: '{existing}' is not writable by this user "
                          f"(uid {os.getuid()}); fix its permissions or choose another path")


def check_memory(config: StoreConfig, *, headroom_bytes: int, memory: MachineMemory, shm_dir: str = SHM_DIR) -> None:
    """Memory tiers against this machine: host tiers (and a GPU tier that runs on the CPU) together
    against MemAvailable - headroom; a shared-memory host arena also against the room in /dev/shm;
    a GPU tier on CUDA against the device's free memory."""
    ram_taken = 0
    for tier in config.tiers:
        on_device = _cuda_free_bytes(tier) if tier.kind is TierKind.GPU else None
        if on_device is not None:
            if tier.capacity_bytes + headroom_bytes > on_device[1]:
                raise ConfigError(_too_big(tier, f"free memory of {on_device[0]}", on_device[1], headroom_bytes))
            continue
        if tier.kind not in (TierKind.HOST, TierKind.GPU):
            continue
        shm_name = tier.options.get("shm_name") if tier.kind is TierKind.HOST else None
        # A segment of the same name is replaced at start: its pages come back before ours are taken.
        reused = _file_size(os.path.join(shm_dir, str(shm_name))) if shm_name else 0
        available = memory.available_bytes + reused - ram_taken
        if tier.capacity_bytes + headroom_bytes > available:
            what = "available RAM (MemAvailable)" + (" after the tiers above" if ram_taken else "")
            raise ConfigError(_too_big(tier, what, available, headroom_bytes))
        ram_taken += tier.capacity_bytes
        if shm_name and tier.capacity_bytes + headroom_bytes > memory.shm_free_bytes + reused:
            raise ConfigError(_too_big(tier, f"free room in {shm_dir} (shared memory '{shm_name}')",
                                       memory.shm_free_bytes + reused, headroom_bytes,
                                       extra=f" or enlarge {shm_dir} (mount -o remount,size=...)"))


def _cuda_free_bytes(tier: TierConfig) -> tuple[str, int] | None:
    """(device, free bytes) for a GPU tier that will run on CUDA; None when it runs on the CPU."""
    import torch

    device = str(tier.options.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None  # on the CPU (or refused by the tier itself: CUDA asked for but absent)
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return device, int(free)


def _too_big(tier: TierConfig, what: str, room: int, headroom: int, extra: str = "") -> str:
    fits = max(0, room - headroom)
    return (f"tier {tier.kind.value}: capacity = {format_bytes(tier.capacity_bytes)} does not fit this machine: "
            f"{what} is {format_bytes(room)}, less the headroom of {format_bytes(headroom)} leaves "
            f"{format_bytes(fits)}; lower capacity to at most {format_bytes(fits)}{extra} "
            "(headroom: service.memory_headroom_bytes)")


def _meminfo_bytes(path: str, field: str) -> int:
    try:
        with open(path) as file:
            for line in file:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62  # not Linux: no figure to check against


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def check_disk_space(config: StoreConfig) -> None:
    """The NVMe and PFS tiers on each filesystem, together, against its free space plus the bytes
    kvstore already holds in their folders (a restart reuses them): refused past it, warned past 90%."""
    by_device: dict[int, list[TierConfig]] = {}
    for tier in config.tiers:
        if tier.kind in (TierKind.NVME, TierKind.PFS) and tier.path:
            by_device.setdefault(os.stat(_existing_parent(tier.path)).st_dev, []).append(tier)
    for tiers in by_device.values():
        existing = _existing_parent(tiers[0].path or ".")
        stat = os.statvfs(existing)
        free = stat.f_bavail * stat.f_frsize
        wanted = sum(t.capacity_bytes for t in tiers)
        if wanted <= DISK_WARN_SHARE * free:
            continue
        held = sum(_bytes_under(t.path or "") for t in tiers)
        room = free + held
        what = " + ".join(f"tier {t.kind.value} ({format_bytes(t.capacity_bytes)})" for t in tiers)
        figures = (f"the filesystem of '{existing}' has {format_bytes(free)} free"
                   + (f" and kvstore holds {format_bytes(held)} there" if held else ""))
        if wanted > room:
            raise ConfigError(f"{what}: capacity {format_bytes(wanted)} does not fit on disk: {figures}; lower "
                              f"capacity to at most {format_bytes(room)} or choose a path on a larger filesystem")
        if wanted > DISK_WARN_SHARE * room:
            logger.warning("%s: capacity %s is %.0f%% of the room on disk (%s); the filesystem may fill "
                           "before the tier does", what, format_bytes(wanted), 100 * wanted / room, figures)


def _existing_parent(path: str) -> str:
    """`path`, or its nearest folder that exists (a tier folder is created at start)."""
    full = Path(path).expanduser().absolute()
    return str(next(p for p in [full, *full.parents] if p.exists()))


def _bytes_under(path: str) -> int:
    """Disk bytes of the files under `path` (0 when it does not exist); walked only near the limit."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total
