"""Start-up checks of a StoreConfig against this machine, run before anything is allocated or created.

Each failure is a ConfigError of one line naming the tier, the field, the value and the fix: tier
paths (under a file, in a missing folder, not writable, read-only), memory: the memory tiers
against the RAM this machine has available (MemAvailable) and a shared-memory arena against the
room in /dev/shm, each keeping `headroom_bytes` free; and disk: the disk tiers on one filesystem
together against its free space (plus what kvstore already holds there), refused past it and
warned past 90%. At a restart (a disk tier holds chunk files) a tier that no longer fits starts capped
to what does, in one warning line, instead of being refused (the rule: docs/capacity.md). These need neither the tier nor the policy registries (nor torch, but for a GPU
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

from kvstore.capacity_caps import CapacityCap
from kvstore.config import StoreConfig, TierConfig
from kvstore.errors import ConfigError
from kvstore.types import CHUNK_SUFFIX, TierKind
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
                  shm_dir: str = SHM_DIR) -> list[CapacityCap]:
    """Memory, every tier's path, then disk space; raises the first failure as a one-line ConfigError.

    Returns the tiers that start below their configured capacity at a restart (each said in one warning
    line); the caller opens the store with them (`TieredStore(config, caps=...)`)."""
    caps = check_memory(config, headroom_bytes=headroom_bytes, memory=memory or MachineMemory.read(shm_dir=shm_dir),
                        shm_dir=shm_dir)
    for tier in config.tiers:
        check_path(tier, creatable_under)
    return [*caps, *check_disk_space(config)]


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


def check_memory(config: StoreConfig, *, headroom_bytes: int, memory: MachineMemory,
                 shm_dir: str = SHM_DIR) -> list[CapacityCap]:
    """Memory tiers against this machine: host tiers (and a GPU tier that runs on the CPU) together
    against MemAvailable - headroom; a shared-memory host arena also against the room in /dev/shm;
    a GPU tier on CUDA against the device's free memory. A host tier too large at a restart is capped
    (`_host_cap`); the caps are returned."""
    caps: list[CapacityCap] = []
    ram_taken = 0
    for tier in config.tiers:
        on_device = _cuda_free_bytes(tier) if tier.kind is TierKind.GPU else None
        if on_device is not None:
            if tier.capacity_bytes + headroom_bytes > on_device[1]:
                raise ConfigError(_too_big(tier, f"free memory of {on_device[0]}", on_device[1], headroom_bytes))
            continue
        if tier.kind not in (TierKind.HOST, TierKind.GPU):
            continue
        rooms = _memory_rooms(tier, memory, ram_taken, shm_dir)
        capacity = tier.capacity_bytes
        short = next((room for room in rooms if capacity + headroom_bytes > room.room_bytes), None)
        if short is not None:
            cap = _host_cap(config, tier, rooms, headroom_bytes)
            if cap is None:
                raise ConfigError(_too_big(tier, short.what, short.room_bytes, headroom_bytes, extra=short.fix))
            logger.warning("%s", cap.describe())
            caps.append(cap)
            capacity = cap.effective_bytes
        ram_taken += capacity
    return caps


@dataclass(frozen=True, slots=True)
class _Room:
    what: str
    room_bytes: int
    fix: str = ""


def _memory_rooms(tier: TierConfig, memory: MachineMemory, ram_taken: int, shm_dir: str) -> list[_Room]:
    """The memory a RAM tier is checked against: available RAM, and /dev/shm's room for a named arena."""
    shm_name = tier.options.get("shm_name") if tier.kind is TierKind.HOST else None
    # A segment of the same name is replaced at start: its pages come back before ours are taken.
    reused = _file_size(os.path.join(shm_dir, str(shm_name))) if shm_name else 0
    what = "available RAM (MemAvailable)" + (" after the tiers above" if ram_taken else "")
    rooms = [_Room(what, memory.available_bytes + reused - ram_taken)]
    if shm_name:
        rooms.append(_Room(f"free room in {shm_dir} (shared memory '{shm_name}')", memory.shm_free_bytes + reused,
                           f" or enlarge {shm_dir} (mount -o remount,size=...)"))
    return rooms


def _host_cap(config: StoreConfig, tier: TierConfig, rooms: list[_Room], headroom_bytes: int) -> CapacityCap | None:
    """A host tier too large for the memory now starts at what fits, less the headroom, when this is a
    restart (a disk tier of this config holds chunk files) and that still holds one chunk; None: refused."""
    room = min(rooms, key=lambda r: r.room_bytes)
    fits = room.room_bytes - headroom_bytes
    if tier.kind is not TierKind.HOST or fits < config.layout.chunk_bytes or not _holds_chunks(config):
        return None
    return CapacityCap(kind=tier.kind, configured_bytes=tier.capacity_bytes, effective_bytes=fits,
                       free_bytes=room.room_bytes, held_bytes=0, where=room.what,
                       rule=f"less the headroom of {format_bytes(headroom_bytes)}, service.memory_headroom_bytes")


def _holds_chunks(config: StoreConfig) -> bool:
    """Whether a disk tier of `config` holds a chunk file: this start is a restart."""
    return any(tier.kind in (TierKind.NVME, TierKind.PFS) and tier.path and _holds_chunk_file(tier.path)
               for tier in config.tiers)


def _holds_chunk_file(path: str) -> bool:
    """Whether some chunk file lies under `path`; stops at the first."""
    for _root, _dirs, files in os.walk(Path(path).expanduser()):
        if any(name.endswith(CHUNK_SUFFIX) for name in files):
            return True
    return False


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


def check_disk_space(config: StoreConfig) -> list[CapacityCap]:
    """The NVMe and PFS tiers on each filesystem, together, against its free space plus the bytes
    kvstore already holds in their folders (a restart reuses them): past it, capped at a restart and
    refused otherwise (`_check_filesystem`); warned past 90%. Returns the caps."""
    by_device: dict[int, list[TierConfig]] = {}
    for tier in config.tiers:
        if tier.kind in (TierKind.NVME, TierKind.PFS) and tier.path:
            by_device.setdefault(os.stat(_existing_parent(tier.path)).st_dev, []).append(tier)
    return [cap for tiers in by_device.values() for cap in _check_filesystem(tiers)]


def _check_filesystem(tiers: list[TierConfig]) -> list[CapacityCap]:
    """Disk tiers sharing one filesystem. Past free + held: refused when the filesystem could not hold
    them even empty, or when they hold no chunk file yet (a first start: likely a typo); otherwise
    (a restart) each starts capped to its share, by capacity, of 90% of free + held."""
    existing = _existing_parent(tiers[0].path or ".")
    stat = os.statvfs(existing)
    free = stat.f_bavail * stat.f_frsize
    wanted = sum(t.capacity_bytes for t in tiers)
    if wanted <= DISK_WARN_SHARE * free:
        return []
    held = {t.kind: _held_under(t.path or "") for t in tiers}
    room = free + sum(h.held_bytes for h in held.values())
    what = " + ".join(f"tier {t.kind.value} ({format_bytes(t.capacity_bytes)})" for t in tiers)
    figures = (f"the filesystem of '{existing}' has {format_bytes(free)} free"
               + (f" and kvstore holds {format_bytes(room - free)} there" if room > free else ""))
    refusal = (f"{what}: capacity {format_bytes(wanted)} does not fit on disk: {figures}; lower capacity to at most "
               f"{format_bytes(room)} or choose a path on a larger filesystem")
    if wanted > room:
        empty = (stat.f_blocks - (stat.f_bfree - stat.f_bavail)) * stat.f_frsize  # what it offers us when empty
        if wanted > empty:
            raise ConfigError(f"{refusal} (even empty it offers only {format_bytes(empty)}, less than the capacity: "
                              "refused at a restart too)")
        if not any(h.chunk_files for h in held.values()):
            raise ConfigError(refusal)
        return [_disk_cap(t, held[t.kind].held_bytes, free=free, room=room, wanted=wanted, shared=len(tiers) > 1)
                for t in tiers]
    if wanted > DISK_WARN_SHARE * room:
        logger.warning("%s: capacity %s is %.0f%% of the room on disk (%s); the filesystem may fill "
                       "before the tier does", what, format_bytes(wanted), 100 * wanted / room, figures)
    return []


def _disk_cap(tier: TierConfig, held_bytes: int, *, free: int, room: int, wanted: int, shared: bool) -> CapacityCap:
    effective = max(1, int(DISK_WARN_SHARE * room * tier.capacity_bytes / wanted))
    rule = (f"{DISK_WARN_SHARE:.0%} of free + held" + (", shared by capacity with the tiers on this filesystem"
                                                        if shared else "") + "; the chunks beyond it are evicted")
    cap = CapacityCap(kind=tier.kind, configured_bytes=tier.capacity_bytes, effective_bytes=effective,
                      free_bytes=free, held_bytes=held_bytes, where=f"the filesystem of '{tier.path}'", rule=rule)
    logger.warning("%s", cap.describe())
    return cap


def _existing_parent(path: str) -> str:
    """`path`, or its nearest folder that exists (a tier folder is created at start)."""
    full = Path(path).expanduser().absolute()
    return str(next(p for p in [full, *full.parents] if p.exists()))


@dataclass(frozen=True, slots=True)
class _Held:
    held_bytes: int
    chunk_files: int


def _held_under(path: str) -> _Held:
    """Disk bytes of the chunk files under `path` and their count (0 when it does not exist): what the
    tier can free by evicting; another process's files there are not room. Walked only near the limit."""
    total = chunks = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            if not name.endswith(CHUNK_SUFFIX):
                continue
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
            chunks += 1
    return _Held(total, chunks)
