"""`HostTier`: host RAM arena, page-locked when CUDA exists, optionally in POSIX shared memory."""

from __future__ import annotations

import logging
from multiprocessing import shared_memory

import torch

from kvstore.errors import ConfigError
from kvstore.types import TierKind
from tiers.arena import ArenaTier
from tiers.file_io import aligned_empty
from tiers.prefault import touch_pages
from tiers.registry import register_tier

logger = logging.getLogger(__name__)


@register_tier
class HostTier(ArenaTier):
    """Chunks in host memory.

    Args:
        capacity_bytes: arena size, allocated up front.
        pin: page-lock the arena for fast DMA to GPUs; None = when CUDA is available.
        shm_name: put the arena in POSIX shared memory under this name (/dev/shm/NAME) so a
            colocated engine process can map it; an old segment of that name is replaced.
        prefault: touch every page at start so the first puts run at memory speed.
    """

    kind = TierKind.HOST

    def __init__(self, *, capacity_bytes: int, pin: bool | None = None, shm_name: str | None = None,
                 prefault: bool = True) -> None:
        self.shm: shared_memory.SharedMemory | None = None
        if shm_name:
            self.shm = _create_shm(shm_name, capacity_bytes)
            arena = torch.frombuffer(self.shm.buf, dtype=torch.uint8, count=capacity_bytes)
        else:
            arena = aligned_empty(capacity_bytes)  # 4 KiB aligned: slots can go to O_DIRECT in place
        self.pinned = False
        if pin is None:
            pin = torch.cuda.is_available()
        if pin:
            self.pinned = _pin(arena)
        if prefault and not self.pinned:
            touch_pages(arena, "host tier")  # page faults now, not in the first puts (pinning faults them itself)
        logger.info("host tier: %.1f MiB arena%s%s", capacity_bytes / 2**20,
                    f" in shared memory {shm_name!r}" if shm_name else "", ", pinned" if self.pinned else "")
        # Page-aligned slots let write-through reach O_DIRECT without staging; tiny arenas (tests,
        # toy layouts) keep 256-byte slots so a few small chunks still fit.
        align = 4096 if capacity_bytes >= 64 * 4096 else 256
        super().__init__(capacity_bytes=capacity_bytes, arena=arena, align=align)

    @property
    def shm_name(self) -> str | None:
        return None if self.shm is None else self.shm.name

    def close(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.arena.data_ptr())
            self.pinned = False
        if self.shm is not None:
            self.arena = torch.empty(0, dtype=torch.uint8)  # drop the view before closing the mapping
            self.shm.close()
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass
            self.shm = None


def _create_shm(name: str, nbytes: int) -> shared_memory.SharedMemory:
    try:
        old = shared_memory.SharedMemory(name=name)
        old.close()
        old.unlink()
    except FileNotFoundError:
        pass
    try:
        return shared_memory.SharedMemory(name=name, create=True, size=nbytes)
    except OSError as exc:
        raise ConfigError(f"cannot create shared memory {name!r} of {nbytes} bytes: {exc}; "
                          "lower the host tier capacity or enlarge /dev/shm") from exc


def _pin(arena: torch.Tensor) -> bool:
    if not torch.cuda.is_available():
        logger.warning("host tier: pinning asked for but CUDA is not available; using pageable memory")
        return False
    result = torch.cuda.cudart().cudaHostRegister(arena.data_ptr(), arena.numel(), 0)
    if int(result) != 0:
        logger.warning("host tier: cudaHostRegister failed (%s); using pageable memory", result)
        return False
    return True
