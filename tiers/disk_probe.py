"""A short write/read probe of the disk under a tier's folder, so `compression = "measured"` weighs its
codecs against this disk instead of a default device (`probe_disk`).

The probe writes blocks of BLOCK_BYTES to one temporary file in the folder with O_DIRECT (buffered, then
fdatasync and dropped from the page cache, where the filesystem refuses O_DIRECT), then reads them back
the same way, and deletes the file. It stops at `max_bytes` or when half of `budget_s` is spent on a
side, whichever comes first (at least MIN_BLOCKS blocks a side), so a slow disk costs at most about
`budget_s` at start and a fast one at most `max_bytes` of writes; with O_DIRECT each side's figure is
the median block's. Results are cached per folder for the life of the process: a second store on the
same folder does not probe again.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvstore.chunk_format import aligned_empty
from tiers.file_io import as_buffer, open_file, pread_all, pwrite_all

logger = logging.getLogger(__name__)

BLOCK_BYTES = 4 << 20
MIN_BLOCKS = 2
PROBE_NAME = ".kvstore-disk-probe"  # not a chunk file name: a tier's scan never takes it for one
_cache: dict[str, DiskSpeed] = {}
_cache_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class DiskSpeed:
    """What one probe of a folder's disk measured."""

    read_bytes_per_s: float
    write_bytes_per_s: float
    probed_bytes: int  # written, then read back
    is_direct: bool  # O_DIRECT (else buffered with the page cache dropped)


def probe_disk(folder: str, *, max_bytes: int = 64 << 20, budget_s: float = 1.0) -> DiskSpeed:
    """Sequential write and read bandwidth of the disk under `folder` (created if missing); cached per folder.

    Raises:
        OSError: the folder cannot be created or written (the tier would fail on it too).
    """
    key = os.path.realpath(folder)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    os.makedirs(key, exist_ok=True)
    speed = _measure(os.path.join(key, f"{PROBE_NAME}.{os.getpid()}.{threading.get_ident()}"),
                     max(MIN_BLOCKS, max_bytes // BLOCK_BYTES), budget_s / 2)
    logger.info("disk under %s: write %.2f GB/s, read %.2f GB/s (%d MiB probed%s)", key,
                speed.write_bytes_per_s / 1e9, speed.read_bytes_per_s / 1e9, speed.probed_bytes >> 20,
                "" if speed.is_direct else ", buffered: the filesystem refuses O_DIRECT")
    with _cache_lock:
        return _cache.setdefault(key, speed)


def _measure(path: str, max_blocks: int, side_budget_s: float) -> DiskSpeed:
    block = aligned_empty(BLOCK_BYTES)
    block.random_(0, 256, generator=torch.Generator().manual_seed(0))  # incompressible, in case the device compresses
    view = as_buffer(block)
    fd, is_direct = open_file(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, direct=True)
    try:
        written, write_s = _timed_blocks(lambda at: pwrite_all(fd, [view], at, direct=is_direct), max_blocks,
                                         side_budget_s, sync=lambda: os.fdatasync(fd), median=is_direct)
        if not is_direct and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the read must come from the disk
        read, read_s = _timed_blocks(lambda at: pread_all(fd, [view], at, direct=is_direct), written,
                                     side_budget_s, sync=lambda: None, median=is_direct)
    finally:
        os.close(fd)
        os.unlink(path)
    return DiskSpeed(read_bytes_per_s=read * BLOCK_BYTES / read_s, write_bytes_per_s=written * BLOCK_BYTES / write_s,
                     probed_bytes=written * BLOCK_BYTES, is_direct=is_direct)


def _timed_blocks(io: Callable[[int], object], max_blocks: int, budget_s: float, *,
                  sync: Callable[[], object], median: bool) -> tuple[int, float]:
    """(blocks done, seconds per block x blocks) of io(offset) block after block, until max_blocks or the
    budget, then sync(). With O_DIRECT (`median`) the median block's time stands for each: on a shared
    machine one block stalled by another process would otherwise set the figure (single probes timed
    whole at load 9 ran at 0.23-1.1x of raw O_DIRECT)."""
    start = time.perf_counter()
    block_s: list[float] = []
    while len(block_s) < max_blocks and (len(block_s) < MIN_BLOCKS or time.perf_counter() - start < budget_s):
        began = time.perf_counter()
        io(len(block_s) * BLOCK_BYTES)
        block_s.append(time.perf_counter() - began)
    began = time.perf_counter()
    sync()
    block_s[-1] += time.perf_counter() - began
    if not median:  # buffered: the blocks land in the page cache, the sync holds the disk's time
        return len(block_s), max(sum(block_s), 1e-9)
    return len(block_s), max(statistics.median(block_s) * len(block_s), 1e-9)
