"""`FileTier`: one chunk per file under fan-out directories, the shared base of NVMeTier and PFSTier.

    root/ab/cd/abcd...(32 hex).kvc          one chunk in kvstore/chunk_format.py's format
    root/ab/cd/.abcd....<host>.<pid>.<n>.tmp   a write in progress (renamed over the .kvc when complete)

A put writes a temp file in the chunk's own directory and renames it over the final name, so a
reader sees the old chunk, the new one, or nothing, never a torn one, even if the writer is killed
(SIGKILL) mid-write. With `sync_writes=False` (default) file and directory are not fsynced: a power
loss or kernel crash can lose recently acknowledged chunks (they read as misses or fail their
checksum and are dropped), but a process kill cannot tear one. `sync_writes=True` fsyncs both.

The in-memory index (key -> metadata, file bytes) is built lazily by scanning the chunk headers on
first use (recovery) and again by every `keys()` call; `used_bytes` is the sum of indexed files
plus puts in flight.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import ClassVar

import torch

from kvstore.chunk_format import (
    ALIGN,
    HEADER_BYTES,
    PAYLOAD_OFFSET,
    ChunkHeader,
    payload_checksum,
    round_up,
    verify_payload,
)
from kvstore.errors import BadChunkError, ConfigError, CorruptChunkError, TierFullError, TierIOError
from kvstore.hashing import validate_key
from kvstore.types import ChunkMeta
from tiers import file_io
from tiers.base import Tier, check_out, check_payload

logger = logging.getLogger(__name__)

CHUNK_SUFFIX = ".kvc"
TEMP_SUFFIX = ".tmp"
_WRITE_FIXES = {
    errno.ENOSPC: "free space on that filesystem or set capacity_bytes below its free space",
    errno.EDQUOT: "raise the disk quota or lower capacity_bytes",
    errno.EFBIG: "the file size limit (ulimit -f) or the filesystem's maximum file size is below the chunk size; raise it",
    errno.EACCES: "make the directory writable by this user or choose another path",
    errno.EROFS: "the filesystem is read-only; remount it read-write or choose another path",
}


@dataclass(frozen=True, slots=True)
class _Entry:
    meta: ChunkMeta
    file_bytes: int


class FileTier(Tier):
    """Chunks as files in a directory tree, written through a bounded thread pool by submit_*/*_many."""

    is_shared: ClassVar[bool] = False  # True: other processes write the same tree; check the files
    stale_temp_grace_s: ClassVar[float] = 0.0  # temp files older than start - grace are leftovers

    def __init__(self, *, path: str | os.PathLike, capacity_bytes: int, num_workers: int = 4,
                 direct_io: bool = True, sync_writes: bool = False) -> None:
        super().__init__(capacity_bytes=capacity_bytes)
        if num_workers < 1:
            raise ConfigError(f"{type(self).__name__} num_workers must be >= 1, got {num_workers}")
        self.root = os.path.abspath(os.fspath(path))
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise TierIOError(f"{type(self).__name__} cannot create its directory {self.root}: {exc}; "
                              "choose a writable path") from exc
        self.direct_io = direct_io
        self.sync_writes = sync_writes
        self.num_corrupt_dropped = 0
        self._start_time = time.time()
        self._temp_tag = f"{socket.gethostname()}.{os.getpid()}"
        self._temp_seq = itertools.count()
        self._lock = threading.Lock()  # index, byte counts, journal
        self._scan_lock = threading.Lock()
        self._index: dict[bytes, _Entry] = {}
        self._committed_bytes = 0
        self._reserved_bytes = 0
        self._journal: list[tuple[bytes, _Entry | None]] | None = None  # index changes during a scan
        self._scanned = False
        self._pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix=f"{self.kind.value}-io")

    # ---- accounting -------------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        self._ensure_scanned()
        return self._committed_bytes + self._reserved_bytes

    def footprint(self, stored_bytes: int) -> int:
        return PAYLOAD_OFFSET + round_up(stored_bytes)

    def _reserve(self, key: bytes, file_bytes: int) -> None:
        with self._lock:
            old = self._index.get(key)
            freed = old.file_bytes if old is not None else 0
            used = self._committed_bytes + self._reserved_bytes
            if used - freed + file_bytes > self.capacity_bytes:
                raise TierFullError(f"{type(self).__name__} at {self.root}: a {file_bytes}-byte chunk file does not fit "
                                    f"(used {used} of {self.capacity_bytes} bytes); evict first")
            self._reserved_bytes += file_bytes

    def _record(self, key: bytes, entry: _Entry | None) -> None:
        """Put (entry) or drop (None) `key` in the index; caller holds no lock."""
        with self._lock:
            old = self._index.pop(key, None)
            if old is not None:
                self._committed_bytes -= old.file_bytes
            if entry is not None:
                self._index[key] = entry
                self._committed_bytes += entry.file_bytes
            if self._journal is not None:
                self._journal.append((key, entry))

    # ---- paths ------------------------------------------------------------------------------
    def chunk_path(self, key: bytes) -> str:
        name = key.hex()
        return os.path.join(self.root, name[:2], name[2:4], name + CHUNK_SUFFIX)

    def _temp_path(self, final: str) -> str:
        directory, name = os.path.split(final)
        return os.path.join(directory, f".{name[:32]}.{self._temp_tag}.{next(self._temp_seq)}{TEMP_SUFFIX}")

    # ---- put --------------------------------------------------------------------------------
    def put(self, key: bytes, payload: torch.Tensor, meta: ChunkMeta) -> None:
        key = validate_key(key)
        check_payload(payload)
        if meta.stored_bytes != payload.numel():
            raise BadChunkError(f"meta.stored_bytes is {meta.stored_bytes} but the payload has {payload.numel()} bytes")
        self._ensure_scanned()
        file_bytes = self.footprint(payload.numel())
        self._reserve(key, file_bytes)
        try:
            self._write_chunk(key, payload, meta, file_bytes)
        finally:
            with self._lock:
                self._reserved_bytes -= file_bytes
        self._record(key, _Entry(meta, file_bytes))

    def _write_chunk(self, key: bytes, payload: torch.Tensor, meta: ChunkMeta, file_bytes: int) -> None:
        final = self.chunk_path(key)
        temp = self._temp_path(final)
        try:
            os.makedirs(os.path.dirname(final), exist_ok=True)
            self._write_file(temp, key, payload, meta)
            os.rename(temp, final)
            if self.sync_writes:
                _fsync_dir(os.path.dirname(final))
        except BaseException as exc:
            _unlink_quiet(temp)
            if isinstance(exc, OSError) and not isinstance(exc, TierIOError):
                raise self._write_error(exc, key, final, file_bytes) from exc
            raise

    def _write_file(self, temp: str, key: bytes, payload: torch.Tensor, meta: ChunkMeta) -> None:
        """Write header block + padded payload to `temp` (O_DIRECT when enabled and accepted)."""
        host = payload if payload.device.type == "cpu" else payload.cpu()
        header = ChunkHeader(codec_id=meta.codec_id, layout_fingerprint=meta.layout_fingerprint, key=key,
                             raw_bytes=meta.raw_bytes, stored_bytes=host.numel(),
                             payload_checksum=payload_checksum(file_io.as_buffer(host)))
        header_block = torch.frombuffer(bytearray(header.pack()), dtype=torch.uint8)
        fd, direct = file_io.open_file(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, direct=self.direct_io)
        try:
            file_io.pwrite_tensor(fd, header_block, 0, direct=direct)
            file_io.pwrite_tensor(fd, host, PAYLOAD_OFFSET, direct=direct)
            if self.sync_writes:
                os.fsync(fd)
        except OSError as exc:
            if not (direct and exc.errno == errno.EINVAL):
                raise
            # Some filesystems accept O_DIRECT at open and refuse it at write: go buffered from now on.
            file_io.warn_no_direct(self.root, exc)
            self.direct_io = False
            os.close(fd)
            fd = -1
            os.unlink(temp)
            self._write_file(temp, key, payload, meta)
        finally:
            if fd >= 0:
                os.close(fd)

    def _write_error(self, exc: OSError, key: bytes, path: str, file_bytes: int) -> TierIOError:
        fix = _WRITE_FIXES.get(exc.errno or 0, "check the device and the directory (dmesg, df -h, permissions)")
        free = ""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            try:
                free = f" ({shutil.disk_usage(self.root).free} bytes free there)"
            except OSError:
                pass
        error = TierIOError(f"{type(self).__name__} could not write chunk {key.hex()} ({file_bytes} bytes) to "
                            f"{path}: [Errno {exc.errno}] {os.strerror(exc.errno or 0)}{free}; {fix}. "
                            "The chunk is not stored in this tier; nothing partial is left.")
        error.errno = exc.errno
        return error

    # ---- get --------------------------------------------------------------------------------
    def get_into(self, key: bytes, out: torch.Tensor) -> int | None:
        key = validate_key(key)
        self._ensure_scanned()
        if not self.is_shared and key not in self._index:
            return None
        path = self.chunk_path(key)
        fd, direct = self._open_for_read(key, path)
        if fd < 0:
            return None
        try:
            header = self._read_header(fd, key, direct)
            check_out(out, header.stored_bytes)
            self._read_payload(fd, direct, header, out)
            if self.is_shared and key not in self._index:
                self._record(key, _Entry(_meta_of(header), header.file_bytes))
            return header.stored_bytes
        except CorruptChunkError as exc:
            self._drop_corrupt(fd, key, path, exc)
            raise
        finally:
            os.close(fd)

    def _open_for_read(self, key: bytes, path: str) -> tuple[int, bool]:
        try:
            return file_io.open_file(path, os.O_RDONLY, direct=self.direct_io)
        except FileNotFoundError:
            self._record(key, None)  # removed behind our back (another process, an operator)
            return -1, False
        except OSError as exc:
            raise TierIOError(f"{type(self).__name__} could not open {path}: {exc}; treat as a miss") from exc

    def _read_header(self, fd: int, key: bytes, direct: bool) -> ChunkHeader:
        block = file_io.staging_buffer(ALIGN)
        got = file_io.pread_tensor(fd, block, ALIGN, 0, direct=direct)
        header = ChunkHeader.unpack(bytes(file_io.as_buffer(block[: min(got, HEADER_BYTES)])))
        if header.key != key:
            raise CorruptChunkError(f"chunk file for {key.hex()} holds key {header.key.hex()}")
        return header

    def _read_payload(self, fd: int, direct: bool, header: ChunkHeader, out: torch.Tensor) -> None:
        nbytes = header.stored_bytes
        host = out if out.device.type == "cpu" else file_io.aligned_empty(round_up(nbytes))
        got = file_io.pread_tensor(fd, host, nbytes, PAYLOAD_OFFSET, direct=direct)
        if got < nbytes:
            raise CorruptChunkError(f"chunk {header.key.hex()} is truncated: {got} payload bytes, header says {nbytes}")
        verify_payload(header, file_io.as_buffer(host[:nbytes]))
        if host is not out:
            out[:nbytes].copy_(host[:nbytes])

    def _drop_corrupt(self, fd: int, key: bytes, path: str, exc: Exception) -> None:
        """Unlink the corrupt file, unless another writer has already replaced it with a new one."""
        mine = os.fstat(fd)
        try:
            now = os.stat(path)
            if (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
                os.unlink(path)
        except FileNotFoundError:
            pass
        self._record(key, None)
        with self._lock:
            self.num_corrupt_dropped += 1
        logger.warning("%s dropped corrupt chunk %s: %s", type(self).__name__, path, exc)

    # ---- meta, remove, keys -----------------------------------------------------------------
    def meta(self, key: bytes) -> ChunkMeta | None:
        key = validate_key(key)
        self._ensure_scanned()
        if not self.is_shared:
            entry = self._index.get(key)
            return None if entry is None else entry.meta
        found = self._scan_chunk(self.chunk_path(key), key.hex())
        self._record(key, None if found is None else found[1])
        return None if found is None else found[1].meta

    def remove(self, key: bytes) -> bool:
        key = validate_key(key)
        self._ensure_scanned()
        try:
            os.unlink(self.chunk_path(key))
            existed = True
        except FileNotFoundError:
            existed = False
        except OSError as exc:
            raise TierIOError(f"{type(self).__name__} could not remove {self.chunk_path(key)}: {exc}") from exc
        self._record(key, None)
        return existed

    def keys(self) -> Iterator[tuple[bytes, ChunkMeta]]:
        """Scan the tree (headers only), drop corrupt files and stale temp files, rebuild the index."""
        self._rescan()
        with self._lock:
            return iter([(key, entry.meta) for key, entry in self._index.items()])

    def _ensure_scanned(self) -> None:
        if not self._scanned:
            self._rescan(only_first=True)

    def _rescan(self, only_first: bool = False) -> None:
        with self._scan_lock:
            if only_first and self._scanned:
                return
            with self._lock:
                self._journal = []
            found = dict(self._scan_tree())
            with self._lock:
                for key, entry in self._journal:
                    if entry is None:
                        found.pop(key, None)
                    else:
                        found[key] = entry
                self._journal = None
                self._index = found
                self._committed_bytes = sum(entry.file_bytes for entry in found.values())
                self._scanned = True
        if self._committed_bytes > self.capacity_bytes:
            logger.warning("%s at %s holds %d bytes, over its capacity of %d; puts fail until chunks are evicted",
                           type(self).__name__, self.root, self._committed_bytes, self.capacity_bytes)

    def _scan_tree(self) -> Iterator[tuple[bytes, _Entry]]:
        for outer in _hex_dirs(self.root):
            for inner in _hex_dirs(outer):
                try:
                    entries = list(os.scandir(inner))
                except FileNotFoundError:
                    continue
                for entry in entries:
                    if entry.name.endswith(TEMP_SUFFIX):
                        self._remove_stale_temp(entry)
                    elif entry.name.endswith(CHUNK_SUFFIX) and len(entry.name) == 32 + len(CHUNK_SUFFIX):
                        found = self._scan_chunk(entry.path, entry.name[:32])
                        if found is not None:
                            yield found

    def _scan_chunk(self, path: str, hex_key: str) -> tuple[bytes, _Entry] | None:
        try:
            key = bytes.fromhex(hex_key)
        except ValueError:
            return None
        try:
            header = _scan_header(path, key)
        except CorruptChunkError as exc:
            _unlink_quiet(path)
            with self._lock:
                self.num_corrupt_dropped += 1
            logger.warning("%s dropped corrupt chunk %s during scan: %s", type(self).__name__, path, exc)
            return None
        return None if header is None else (key, _Entry(_meta_of(header), header.file_bytes))

    def _remove_stale_temp(self, entry: os.DirEntry) -> None:
        try:
            if entry.stat().st_mtime < self._start_time - self.stale_temp_grace_s:
                os.unlink(entry.path)
                logger.info("%s removed leftover temp file %s (an interrupted write)", type(self).__name__, entry.path)
        except FileNotFoundError:
            pass

    # ---- pool -------------------------------------------------------------------------------
    def submit_put(self, key: bytes, payload: torch.Tensor, meta: ChunkMeta) -> Future[None]:
        return self._pool.submit(self.put, key, payload, meta)

    def submit_get(self, key: bytes, out: torch.Tensor) -> Future[int | None]:
        return self._pool.submit(self.get_into, key, out)

    def put_many(self, items: Sequence[tuple[bytes, torch.Tensor, ChunkMeta]]) -> None:
        _wait_all([self.submit_put(key, payload, meta) for key, payload, meta in items])

    def get_many(self, keys: Sequence[bytes], outs: Sequence[torch.Tensor]) -> list[int | None]:
        return _wait_all([self.submit_get(key, out) for key, out in zip(keys, outs, strict=True)])

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __len__(self) -> int:
        self._ensure_scanned()
        return len(self._index)


def _wait_all(futures: list[Future]) -> list:
    """Wait for every future (no I/O still writing into caller buffers), then raise the first error."""
    wait(futures)
    return [future.result() for future in futures]


def _meta_of(header: ChunkHeader) -> ChunkMeta:
    return ChunkMeta(codec_id=header.codec_id, raw_bytes=header.raw_bytes, stored_bytes=header.stored_bytes,
                     layout_fingerprint=header.layout_fingerprint)


def _scan_header(path: str, key: bytes) -> ChunkHeader | None:
    """The header of the chunk file at `path`, None if it does not exist; CorruptChunkError if bad."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        header = ChunkHeader.unpack(os.pread(fd, HEADER_BYTES, 0))
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if header.key != key:
        raise CorruptChunkError(f"chunk file {path} holds key {header.key.hex()}")
    if size < header.file_bytes:
        raise CorruptChunkError(f"chunk file {path} is truncated: {size} bytes, header says {header.file_bytes}")
    return header


def _hex_dirs(parent: str) -> list[str]:
    try:
        return [entry.path for entry in os.scandir(parent)
                if len(entry.name) == 2 and entry.is_dir() and all(c in "0123456789abcdef" for c in entry.name)]
    except FileNotFoundError:
        return []


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
