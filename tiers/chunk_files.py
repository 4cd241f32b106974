"""Chunk files on disk: where they live, how one is written and read back verified, how a tree is listed.

    root/ab/cd/abcd...(32 hex).kvc               one chunk in kvstore/chunk_format.py's format
    root/ab/cd/.abcd...(32 hex).<host>.<pid>.<n>.tmp   a write in progress, renamed over the .kvc
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Callable, Iterator

import torch
import xxhash

from kvstore.chunk_format import (
    ALIGN,
    HEADER_BYTES,
    PAYLOAD_OFFSET,
    ChunkHeader,
    payload_checksum,
    round_up,
    verify_payload,
)
from kvstore.errors import CorruptChunkError, TierIOError
from kvstore.types import CHUNK_SUFFIX, ChunkMeta
from tiers import file_io
from tiers.base import check_out
from tiers.byte_copy import copy_bytes

logger = logging.getLogger(__name__)

TEMP_SUFFIX = ".tmp"
SEGMENT_BYTES = 2 << 20  # a streamed read's step: small enough to overlap decoding, large enough for the disk
_HEX = frozenset("0123456789abcdef")
_WRITE_FIXES = {
    errno.ENOSPC: "free space on that filesystem or set capacity_bytes below its free space",
    errno.EDQUOT: "raise the disk quota or lower capacity_bytes",
    errno.EFBIG: "the file size limit (ulimit -f) or the filesystem's maximum file size is below the chunk size; raise it",
    errno.EACCES: "make the directory writable by this user or choose another path",
    errno.EROFS: "the filesystem is read-only; remount it read-write or choose another path",
}


def chunk_path(root: str, key: bytes) -> str:
    name = key.hex()
    return os.path.join(root, name[:2], name[2:4], name + CHUNK_SUFFIX)


def temp_path(final: str, tag: str) -> str:
    """A temp name beside `final`, unique per host/process/write (`tag`), so a rename is atomic."""
    directory, name = os.path.split(final)
    return os.path.join(directory, f".{name[:32]}.{tag}{TEMP_SUFFIX}")


def meta_of(header: ChunkHeader) -> ChunkMeta:
    return ChunkMeta(codec_id=header.codec_id, raw_bytes=header.raw_bytes, stored_bytes=header.stored_bytes,
                     layout_fingerprint=header.layout_fingerprint)


def write_chunk_file(path: str, key: bytes, host: torch.Tensor, meta: ChunkMeta, *, direct: bool,
                     sync: bool) -> bool:
    """Create `path` (a fresh unique name) holding header block + 4 KiB-padded payload.

    Returns whether O_DIRECT was used (False when asked for but refused). Raises OSError.
    """
    header = ChunkHeader(codec_id=meta.codec_id, layout_fingerprint=meta.layout_fingerprint, key=key,
                         raw_bytes=meta.raw_bytes, stored_bytes=host.numel(),
                         payload_checksum=payload_checksum(file_io.as_buffer(host)))
    fd, is_direct = file_io.open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, direct=direct)
    try:
        file_io.pwrite_tensor(fd, host, 0, direct=is_direct, head=header.pack())  # header block, then payload
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return is_direct


def read_chunk(fd: int, key: bytes, out: torch.Tensor, *, direct: bool, expected_bytes: int | None,
               on_ready: Callable[[int], None] | None = None) -> ChunkHeader:
    """Read and verify a whole chunk into `out`; CorruptChunkError if bad, BadChunkError if `out` is small.

    When the payload size is known (`expected_bytes`, from an index) header and payload come in one
    read; otherwise, or if the file turned out to hold another size, the header is read first.
    With `on_ready` (see `Tier.get_into_streamed`) a known-size payload is read in segments of
    SEGMENT_BYTES, `on_ready(n)` called after each, the checksum taken as the bytes arrive.
    """
    if expected_bytes is not None and out.device.type == "cpu" and expected_bytes <= out.numel():
        if on_ready is not None and expected_bytes > SEGMENT_BYTES and file_io.is_aligned(out):
            header = _read_segments(fd, key, out, expected_bytes, direct, on_ready)
            if header is not None:
                return header
        else:
            head, got = file_io.pread_block_and_tensor(fd, out, expected_bytes, 0, direct=direct)
            header = _parse_header(head, key)
            if header.stored_bytes == expected_bytes:
                _verify(header, out, got)
                _announce(on_ready, expected_bytes)
                return header
    header = read_header(fd, key, direct=direct)
    check_out(out, header.stored_bytes)
    read_payload(fd, header, out, direct=direct)
    _announce(on_ready, header.stored_bytes)
    return header


def _announce(on_ready: Callable[[int], None] | None, nbytes: int) -> None:
    if on_ready is not None:
        on_ready(nbytes)


def _read_segments(fd: int, key: bytes, out: torch.Tensor, nbytes: int, direct: bool,
                   on_ready: Callable[[int], None]) -> ChunkHeader | None:
    """Header block and payload in SEGMENT_BYTES reads, `on_ready` after each; None (nothing announced)
    when the file holds another size than `nbytes`, for the caller to read it header first."""
    head, got = file_io.pread_block_and_tensor(fd, out, SEGMENT_BYTES, 0, direct=direct)
    header = _parse_header(head, key)
    if header.stored_bytes != nbytes:
        return None
    hasher = xxhash.xxh3_64()  # the streamed form of payload_checksum: the same digest
    done = 0
    while got > 0:
        hasher.update(file_io.as_buffer(out[done : done + got]))
        done += got
        on_ready(done)
        want = min(SEGMENT_BYTES, nbytes - done)
        if want <= 0 or got % SEGMENT_BYTES:  # complete, or a short read (a truncated file)
            break
        got = file_io.pread_tensor(fd, out[done:], want, PAYLOAD_OFFSET + done, direct=direct)
    if done < nbytes:
        raise CorruptChunkError(f"chunk {header.key.hex()} is truncated: {done} payload bytes, "
                                f"header says {header.stored_bytes}")
    if hasher.intdigest() != header.payload_checksum:
        raise CorruptChunkError(f"chunk {header.key.hex()} payload checksum mismatch")
    return header


def _parse_header(block: bytes, key: bytes) -> ChunkHeader:
    header = ChunkHeader.unpack(block[:HEADER_BYTES])
    if header.key != key:
        raise CorruptChunkError(f"chunk file for {key.hex()} holds key {header.key.hex()}")
    return header


def _verify(header: ChunkHeader, host: torch.Tensor, got: int) -> None:
    if got < header.stored_bytes:
        raise CorruptChunkError(f"chunk {header.key.hex()} is truncated: {got} payload bytes, "
                                f"header says {header.stored_bytes}")
    verify_payload(header, file_io.as_buffer(host[: header.stored_bytes]))


def read_header(fd: int, key: bytes, *, direct: bool) -> ChunkHeader:
    """Read and check the header block of an open chunk file; CorruptChunkError if it is bad."""
    block = file_io.staging_buffer(ALIGN)
    got = file_io.pread_tensor(fd, block, ALIGN, 0, direct=direct)
    return _parse_header(bytes(file_io.as_buffer(block[: min(got, HEADER_BYTES)])), key)


def read_payload(fd: int, header: ChunkHeader, out: torch.Tensor, *, direct: bool) -> None:
    """Read the payload into `out[:stored_bytes]` and verify its checksum; CorruptChunkError if bad."""
    nbytes = header.stored_bytes
    host = out if out.device.type == "cpu" else file_io.aligned_empty(round_up(nbytes))
    _verify(header, host, file_io.pread_tensor(fd, host, nbytes, PAYLOAD_OFFSET, direct=direct))
    if host is not out:
        copy_bytes(out[:nbytes], host[:nbytes])


def scan_header(path: str, key: bytes) -> ChunkHeader | None:
    """The header of the chunk file at `path` (None if absent). A bad or truncated file is unlinked
    (unless a writer has just replaced it) and CorruptChunkError raised."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        header = ChunkHeader.unpack(os.pread(fd, HEADER_BYTES, 0))
        if header.key != key:
            raise CorruptChunkError(f"chunk file {path} holds key {header.key.hex()}")
        size = os.fstat(fd).st_size
        if size < header.file_bytes:
            raise CorruptChunkError(f"chunk file {path} is truncated: {size} bytes, header says {header.file_bytes}")
        return header
    except CorruptChunkError:
        drop_if_same_file(fd, path)
        raise
    finally:
        os.close(fd)


def iter_tree(root: str) -> Iterator[os.DirEntry]:
    """Every entry of every fan-out directory root/xx/yy (chunks and temp files alike)."""
    for outer in _hex_dirs(root):
        for inner in _hex_dirs(outer):
            try:
                entries = list(os.scandir(inner))
            except FileNotFoundError:
                continue
            yield from entries


def remove_if_stale(entry: os.DirEntry, older_than: float, own_tag: str) -> None:
    """Unlink a temp file last written before `older_than` (an interrupted write), never one of ours.

    Our own temp files are writes in flight: file times come from a coarse clock and can read a few
    ms before the tier's start, so they must never be judged by age.
    """
    if f".{own_tag}." in entry.name:
        return
    try:
        if entry.stat().st_mtime < older_than:
            os.unlink(entry.path)
            logger.info("removed leftover temp file %s (an interrupted write)", entry.path)
    except FileNotFoundError:
        pass


def key_of_chunk_name(name: str) -> bytes | None:
    if not name.endswith(CHUNK_SUFFIX) or len(name) != 32 + len(CHUNK_SUFFIX) or not _HEX.issuperset(name[:32]):
        return None
    return bytes.fromhex(name[:32])


def _hex_dirs(parent: str) -> list[str]:
    try:
        return [entry.path for entry in os.scandir(parent)
                if len(entry.name) == 2 and _HEX.issuperset(entry.name) and entry.is_dir()]
    except FileNotFoundError:
        return []


def drop_if_same_file(fd: int, path: str) -> bool:
    """Unlink `path` if it is still the file open as `fd` (not a newer chunk another writer renamed in);
    True when `path` no longer holds a chunk (unlinked here or already gone)."""
    mine = os.fstat(fd)
    try:
        now = os.stat(path)
        if (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
            os.unlink(path)
            return True
    except FileNotFoundError:
        return True
    return False


def write_error(exc: OSError, *, tier: str, root: str, key: bytes, path: str, file_bytes: int) -> TierIOError:
    """A TierIOError naming the path, the size, the errno text and the fix."""
    fix = _WRITE_FIXES.get(exc.errno or 0, "check the device and the directory (dmesg, df -h, permissions)")
    free = ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = f" ({shutil.disk_usage(root).free} bytes free there)"
        except OSError:
            pass
    error = TierIOError(f"{tier} could not write chunk {key.hex()} ({file_bytes} bytes) to {path}: "
                        f"[Errno {exc.errno}] {os.strerror(exc.errno or 0)}{free}; {fix}. "
                        "The chunk is not stored in this tier and nothing partial is left.")
    error.errno = exc.errno
    return error


def check_writable(root: str, tier: str) -> None:
    """Refuse to start on a directory this process cannot write (read-only mount, full disk, permissions):
    create, write and remove a small probe file, and raise TierIOError naming the cause and the fix."""
    probe = os.path.join(root, f".write-probe.{os.getpid()}{TEMP_SUFFIX}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * 512)
        finally:
            os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        unlink_quiet(probe)
        fix = _WRITE_FIXES.get(exc.errno or 0, "check the device and the directory (dmesg, df -h, permissions)")
        error = TierIOError(f"{tier} cannot write its directory {root}: [Errno {exc.errno}] "
                            f"{os.strerror(exc.errno or 0)}; {fix}")
        error.errno = exc.errno
        raise error from exc


def unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
