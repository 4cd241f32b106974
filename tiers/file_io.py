"""Low-level file I/O for disk tiers: aligned buffers, O_DIRECT with buffered fallback, full pread/pwrite.

O_DIRECT needs the buffer address, the length and the file offset to be multiples of the logical
block size; we use 4096 (`ALIGN`) everywhere. A caller tensor that is 4096-aligned is read/written
in place (zero copy) for its whole blocks; its last partial block, and every byte of an unaligned
tensor, go through a per-thread aligned staging buffer that is reused across calls:

    caller tensor  |<-------- whole 4 KiB blocks: preadv/pwritev in place -------->|tail|
    staging (4 KiB)                                                                |tail|000|

Buffered mode (no O_DIRECT) reads and writes caller memory directly whatever its alignment.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
import uuid

import torch

from kvstore.chunk_format import ALIGN, aligned_empty, round_up

logger = logging.getLogger(__name__)

STAGING_BYTES = 8 << 20  # an unaligned tensor moves through staging in pieces of this size
_local = threading.local()
_warned_dirs: set[str] = set()
_warned_lock = threading.Lock()


def is_aligned(tensor: torch.Tensor, align: int = ALIGN) -> bool:
    return tensor.device.type == "cpu" and tensor.data_ptr() % align == 0


def staging_buffer(nbytes: int) -> torch.Tensor:
    """This thread's reusable aligned buffer, grown to at least round_up(nbytes); do not keep it."""
    need = round_up(max(nbytes, ALIGN))
    buf = getattr(_local, "staging", None)
    if buf is None or buf.numel() < need:
        buf = aligned_empty(need)
        _local.staging = buf
    return buf[:need]


def as_buffer(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous 1-D uint8 CPU tensor, sharing its memory."""
    return tensor.numpy().data.cast("B")


def open_file(path: str, flags: int, *, direct: bool, mode: int = 0o644) -> tuple[int, bool]:
    """Open `path`, with O_DIRECT when asked and the filesystem allows it.

    Returns:
        (fd, is_direct). When the filesystem refuses O_DIRECT (EINVAL: ramfs, tmpfs on old kernels,
        many FUSE/NFS mounts) the file is opened buffered; the caller says so once (`warn_no_direct`).
        Some filesystems create the file before refusing, so the buffered retry drops O_EXCL: callers
        that pass O_EXCL must use names no one else uses (temp names with host, pid and a counter).
    """
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT, mode), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
        flags &= ~os.O_EXCL
    return os.open(path, flags, mode), False


def warn_no_direct(directory: str) -> None:
    """Log once per directory that its filesystem refused O_DIRECT."""
    with _warned_lock:
        if directory in _warned_dirs:
            return
        _warned_dirs.add(directory)
    logger.warning("filesystem at %s refuses O_DIRECT (EINVAL); using buffered I/O there (page cache in the path)",
                   directory)


def _advance(views: list[memoryview], nbytes: int) -> list[memoryview]:
    while views and nbytes >= len(views[0]):
        nbytes -= len(views[0])
        views = views[1:]
    if views and nbytes:
        views = [views[0][nbytes:], *views[1:]]
    return views


def pwrite_all(fd: int, views: list[memoryview], offset: int, *, direct: bool = False) -> None:
    """Write every byte of `views` at `offset`, looping over short writes.

    An O_DIRECT write that stops off a 4 KiB boundary cannot be resumed (the retry would be unaligned):
    that only happens when the device runs out of space, so it raises ENOSPC.
    """
    views = [v for v in views if len(v)]
    while views:
        done = os.pwritev(fd, views, offset)
        if done <= 0:
            raise OSError(errno.EIO, f"pwritev wrote {done} bytes")
        offset += done
        views = _advance(views, done)
        if views and direct and done % ALIGN:
            raise OSError(errno.ENOSPC, f"O_DIRECT write stopped after {offset} bytes (device full)")


def pread_all(fd: int, views: list[memoryview], offset: int, *, direct: bool = False) -> int:
    """Fill `views` from `offset`, looping over short reads; returns the bytes read (less only at EOF).

    An O_DIRECT read that ends off a 4 KiB boundary can only be EOF, and retrying it would be an
    unaligned read (EINVAL), so it stops there.
    """
    views = [v for v in views if len(v)]
    total = 0
    while views:
        done = os.preadv(fd, views, offset)
        total += done
        if done == 0 or (direct and done % ALIGN):
            break
        offset += done
        views = _advance(views, done)
    return total


def pwrite_tensor(fd: int, tensor: torch.Tensor, offset: int, *, direct: bool, head: bytes = b"") -> int:
    """Write `head` as one zero-padded 4 KiB block (if given), then a 1-D uint8 CPU tensor zero-padded to
    4 KiB, at `offset` (4 KiB aligned); one pwritev when the tensor is aligned. Returns bytes written."""
    if len(head) > ALIGN:
        raise ValueError(f"head is {len(head)} bytes; at most {ALIGN}")
    nbytes = tensor.numel()
    padded = round_up(nbytes)
    head_bytes = ALIGN if head else 0
    if not direct:
        views = [memoryview(head.ljust(ALIGN, b"\0"))] if head else []
        pwrite_all(fd, [*views, as_buffer(tensor), memoryview(bytes(padded - nbytes))], offset)
        return head_bytes + padded
    blocks = staging_buffer(2 * ALIGN)  # [head block | tail block]
    views = []
    if head:
        blocks[: len(head)].copy_(torch.frombuffer(bytearray(head), dtype=torch.uint8))
        blocks[len(head) : ALIGN].zero_()
        views.append(as_buffer(blocks[:ALIGN]))
    aligned = is_aligned(tensor)
    body = nbytes // ALIGN * ALIGN if aligned else 0
    if aligned or nbytes <= ALIGN:  # whole blocks in place, the rest through the tail block
        views.append(as_buffer(tensor[:body]))
        if nbytes > body:
            blocks[ALIGN : ALIGN + nbytes - body].copy_(tensor[body:])
            blocks[ALIGN + nbytes - body :].zero_()
            views.append(as_buffer(blocks[ALIGN:]))
        pwrite_all(fd, views, offset, direct=True)
        return head_bytes + padded
    if views:
        pwrite_all(fd, views, offset, direct=True)
    for start in range(0, nbytes, STAGING_BYTES):
        piece = tensor[start : start + STAGING_BYTES]
        stage = staging_buffer(piece.numel())
        stage[: piece.numel()].copy_(piece)
        stage[piece.numel() :].zero_()
        pwrite_all(fd, [as_buffer(stage)], offset + head_bytes + start, direct=True)
    return head_bytes + padded


def pread_tensor(fd: int, out: torch.Tensor, nbytes: int, offset: int, *, direct: bool) -> int:
    """Read `nbytes` at `offset` into `out[:nbytes]` (1-D uint8 CPU); returns bytes read (less if truncated)."""
    if not direct:
        return pread_all(fd, [as_buffer(out[:nbytes])], offset)
    body = nbytes // ALIGN * ALIGN if is_aligned(out) else 0
    if body:
        tail_bytes = nbytes - body
        views = [as_buffer(out[:body])]
        block = staging_buffer(ALIGN) if tail_bytes else None
        if block is not None:
            views.append(as_buffer(block))
        got = pread_all(fd, views, offset, direct=True)
        if block is not None and got > body:
            usable = min(tail_bytes, got - body)
            out[body : body + usable].copy_(block[:usable])
        return min(got, nbytes)
    total = 0
    for start in range(0, nbytes, STAGING_BYTES):
        want = min(STAGING_BYTES, nbytes - start)
        stage = staging_buffer(want)
        got = pread_all(fd, [as_buffer(stage)], offset + start, direct=True)
        usable = min(want, got)
        out[start : start + usable].copy_(stage[:usable])
        total += usable
        if got < want:
            break
    return total


def pread_block_and_tensor(fd: int, out: torch.Tensor, nbytes: int, offset: int, *, direct: bool) -> tuple[bytes, int]:
    """Read the 4 KiB block at `offset` and the `nbytes` after it into `out[:nbytes]`, in one preadv
    when `out` is aligned (one device round trip instead of two). Returns (block bytes, payload bytes read)."""
    if direct and not is_aligned(out):
        block = staging_buffer(ALIGN)
        got = pread_all(fd, [as_buffer(block)], offset, direct=True)
        head = bytes(as_buffer(block[:got]))
        return head, pread_tensor(fd, out, nbytes, offset + ALIGN, direct=True) if got == ALIGN else 0
    blocks = staging_buffer(2 * ALIGN)  # [head block | payload tail block]
    body = nbytes // ALIGN * ALIGN if direct else nbytes
    tail_bytes = nbytes - body
    views = [as_buffer(blocks[:ALIGN]), as_buffer(out[:body])]
    if tail_bytes:
        views.append(as_buffer(blocks[ALIGN:]))
    got = pread_all(fd, views, offset, direct=direct)
    head = bytes(as_buffer(blocks[: min(got, ALIGN)]))
    payload_got = max(0, got - ALIGN)
    if tail_bytes and payload_got > body:
        usable = min(tail_bytes, payload_got - body)
        out[body : body + usable].copy_(blocks[ALIGN : ALIGN + usable])
    return head, min(payload_got, nbytes)


def evict_page_cache(path: str) -> int:
    """Write back and drop the page-cache pages of a file, or of every file under a directory, so a
    benchmark of a buffered tier (PFS) reads the device, not memory. Returns the number of files."""
    paths = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, names in os.walk(path) for f in names]
    for name in paths:
        try:
            fd = os.open(name, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fdatasync(fd)  # dirty pages are not dropped, so write them first
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return len(paths)


def raw_odirect_throughput(path: str, nbytes: int, repeats: int = 3) -> dict[str, float]:
    """Baseline for the disk tiers: sequential O_DIRECT write then read of `nbytes` in directory `path`.

    Each repeat creates a new file, writes it in one aligned pwritev, closes it, then opens and reads it
    back with O_DIRECT. Returns the best of `repeats` as {"write_gbps", "read_gbps", "direct"} (GB = 1e9
    bytes); "direct" is 0.0 when the filesystem refused O_DIRECT and buffered I/O was measured instead.
    """
    nbytes = round_up(nbytes)
    buf = aligned_empty(nbytes)
    buf.random_(0, 256, generator=torch.Generator().manual_seed(0))
    target = os.path.join(path, f".raw-odirect-{uuid.uuid4().hex}.tmp")
    best_write = best_read = 0.0
    is_direct = True
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            fd, is_direct = open_file(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, direct=True)
            try:
                pwrite_all(fd, [as_buffer(buf)], 0, direct=is_direct)
            finally:
                os.close(fd)
            best_write = max(best_write, nbytes / (time.perf_counter() - start) / 1e9)
            start = time.perf_counter()
            fd, is_direct = open_file(target, os.O_RDONLY, direct=True)
            try:
                pread_all(fd, [as_buffer(buf)], 0, direct=is_direct)
            finally:
                os.close(fd)
            best_read = max(best_read, nbytes / (time.perf_counter() - start) / 1e9)
            os.unlink(target)
    finally:
        if os.path.exists(target):
            os.unlink(target)
    return {"write_gbps": best_write, "read_gbps": best_read, "direct": float(is_direct)}
