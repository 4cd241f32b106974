"""`FileTier`: one chunk per file under fan-out directories, the shared base of NVMeTier and PFSTier.

File names and format: tiers/chunk_files.py. A put writes a temp file in the chunk's own directory
and renames it over the final name, so a reader sees the old chunk, the new one, or nothing, never
a torn one, even if the writer is killed (SIGKILL) mid-write. With `sync_writes=False` (default) file and directory are not fsynced: a power
loss or kernel crash can lose recently acknowledged chunks (they read as misses or fail their
checksum and are dropped), but a process kill cannot tear one. `sync_writes=True` fsyncs both.

The in-memory index (key -> metadata, file bytes) is rebuilt by `keys()`, which scans the chunk
headers (recovery); tiers with `scan_on_open` (NVMe) also scan on first use. `used_bytes` is the
sum of indexed files plus puts in flight.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import ClassVar

import torch

from kvstore.chunk_format import PAYLOAD_OFFSET, ChunkHeader, round_up
from kvstore.errors import BadChunkError, ConfigError, CorruptChunkError, TierFullError, TierIOError
from kvstore.hashing import validate_key
from kvstore.key_table import KeyTable
from kvstore.types import ChunkMeta, shared_meta
from tiers import chunk_files, file_io
from tiers.base import Tier, check_payload

logger = logging.getLogger(__name__)
_TEMP_SEQ = itertools.count()  # process-wide: two tiers over one directory never pick the same temp name
KEY_LOCK_STRIPES = 64


class FileTier(Tier):
    """Chunks as files in a directory tree, written through a bounded thread pool by submit_*/*_many."""

    is_shared: ClassVar[bool] = False  # True: other processes write the same tree; check the files
    scan_on_open: ClassVar[bool] = True  # scan the tree on first use so used_bytes/keys are known at once
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
        self._lock = threading.Lock()  # index, byte counts, journal
        # A chunk file's rename/unlink and its index record happen under its key's lock, so the index
        # ends as the disk does when threads replace or remove the same key at once.
        self._key_locks = [threading.Lock() for _ in range(KEY_LOCK_STRIPES)]
        self._scan_lock = threading.Lock()
        # key -> metadata (shared objects, `shared_meta`): the one per-chunk record, the file's size derived from it;
        # a KeyTable (millions of records: about 35 bytes each, where a dict under eviction keeps 60-120), under _lock
        self._index: KeyTable[ChunkMeta] = KeyTable()
        self._committed_bytes = 0
        self._reserved_bytes = 0
        self._journal: list[tuple[bytes, ChunkMeta | None]] | None = None  # index changes during a scan
        self._scanned = not self.scan_on_open
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
            freed = self.footprint(old.stored_bytes) if old is not None else 0
            used = self._committed_bytes + self._reserved_bytes
            if used - freed + file_bytes > self.capacity_bytes:
                raise TierFullError(f"{type(self).__name__} at {self.root}: a {file_bytes}-byte chunk file does not fit "
                                    f"(used {used} of {self.capacity_bytes} bytes); evict first")
            self._reserved_bytes += file_bytes

    def _key_lock(self, key: bytes) -> threading.Lock:
        return self._key_locks[hash(key) % KEY_LOCK_STRIPES]

    def _record(self, key: bytes, meta: ChunkMeta | None) -> None:
        """Put (meta) or drop (None) `key` in the index; caller holds no lock."""
        if meta is not None:
            meta = shared_meta(meta)
        with self._lock:
            old = self._index.pop(key, None)
            if old is not None:
                self._committed_bytes -= self.footprint(old.stored_bytes)
            if meta is not None:
                self._index.put(key, meta)
                self._committed_bytes += self.footprint(meta.stored_bytes)
            if self._journal is not None:
                self._journal.append((key, meta))

    # ---- paths ------------------------------------------------------------------------------
    def chunk_path(self, key: bytes) -> str:
        return chunk_files.chunk_path(self.root, key)

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
            self._write_chunk(key, payload, meta, file_bytes)  # recorded in the index as it lands
        finally:
            with self._lock:
                self._reserved_bytes -= file_bytes

    def _write_chunk(self, key: bytes, payload: torch.Tensor, meta: ChunkMeta, file_bytes: int) -> None:
        final = self.chunk_path(key)
        temp = chunk_files.temp_path(final, f"{self._temp_tag}.{next(_TEMP_SEQ)}")
        try:
            os.makedirs(os.path.dirname(final), exist_ok=True)
            self._write_file(temp, key, payload, meta)
            with self._key_lock(key):
                os.rename(temp, final)
                self._record(key, meta)
            if self.sync_writes:
                chunk_files.fsync_dir(os.path.dirname(final))
        except BaseException as exc:
            chunk_files.unlink_quiet(temp)
            if isinstance(exc, OSError) and not isinstance(exc, TierIOError):
                raise chunk_files.write_error(exc, tier=type(self).__name__, root=self.root, key=key, path=final,
                                              file_bytes=file_bytes) from exc
            raise

    def _write_file(self, temp: str, key: bytes, payload: torch.Tensor, meta: ChunkMeta) -> None:
        """Write the chunk file `temp`; subclasses add device paths (kvikio)."""
        host = payload if payload.device.type == "cpu" else payload.cpu()
        try:
            is_direct = chunk_files.write_chunk_file(temp, key, host, meta, direct=self.direct_io,
                                                     sync=self.sync_writes)
        except OSError as exc:
            if not (self.direct_io and exc.errno == errno.EINVAL):
                raise
            # Some filesystems accept O_DIRECT at open and refuse it at write: go buffered from now on.
            self._stop_direct_io()
            chunk_files.unlink_quiet(temp)
            is_direct = chunk_files.write_chunk_file(temp, key, host, meta, direct=False, sync=self.sync_writes)
        if self.direct_io and not is_direct:
            self._stop_direct_io()

    def _stop_direct_io(self) -> None:
        self.direct_io = False
        file_io.warn_no_direct(self.root)

    # ---- get --------------------------------------------------------------------------------
    def get_into(self, key: bytes, out: torch.Tensor) -> int | None:
        return self._get(key, out, None)

    def get_into_streamed(self, key: bytes, out: torch.Tensor, on_ready: Callable[[int], None]) -> int | None:
        return self._get(key, out, on_ready)

    def _get(self, key: bytes, out: torch.Tensor, on_ready: Callable[[int], None] | None) -> int | None:
        key = validate_key(key)
        self._ensure_scanned()
        with self._lock:
            known = self._index.get(key)
        if not self.is_shared and known is None:
            return None
        path = self.chunk_path(key)
        fd, direct = self._open_for_read(key, path)
        if fd < 0:
            return None
        try:
            expected = None if known is None else known.stored_bytes
            header = self._read_chunk(fd, key, out, direct=direct, expected_bytes=expected, on_ready=on_ready)
            meta = chunk_files.meta_of(header)
            if self.is_shared and (known is None or known != meta):  # new to us, or rewritten by another
                self._record(key, meta)
            return header.stored_bytes
        except CorruptChunkError as exc:
            self._drop_corrupt(fd, key, path, exc)
            raise
        except OSError as exc:
            if isinstance(exc, TierIOError):
                raise
            raise TierIOError(f"{type(self).__name__} could not read {path}: {exc}; treat as a miss") from exc
        finally:
            os.close(fd)

    def _open_for_read(self, key: bytes, path: str) -> tuple[int, bool]:
        try:
            fd, is_direct = file_io.open_file(path, os.O_RDONLY, direct=self.direct_io)
        except FileNotFoundError:
            with self._key_lock(key):
                if not os.path.exists(path):  # removed behind our back (another process, an operator)
                    self._record(key, None)
            return -1, False
        except OSError as exc:
            raise TierIOError(f"{type(self).__name__} could not open {path}: {exc}; treat as a miss") from exc
        if self.direct_io and not is_direct:
            self._stop_direct_io()
        return fd, is_direct

    def _read_chunk(self, fd: int, key: bytes, out: torch.Tensor, *, direct: bool, expected_bytes: int | None,
                    on_ready: Callable[[int], None] | None = None) -> ChunkHeader:
        """Read and verify header + payload into `out` (announced to `on_ready`, see `get_into_streamed`);
        subclasses add device paths (kvikio)."""
        return chunk_files.read_chunk(fd, key, out, direct=direct, expected_bytes=expected_bytes, on_ready=on_ready)

    def _drop_corrupt(self, fd: int, key: bytes, path: str, exc: Exception) -> None:
        """Unlink the corrupt file, unless another writer has already replaced it with a new one."""
        with self._key_lock(key):
            if chunk_files.drop_if_same_file(fd, path):
                self._record(key, None)
        with self._lock:
            self.num_corrupt_dropped += 1
        logger.warning("%s dropped corrupt chunk %s: %s", type(self).__name__, path, exc)

    # ---- meta, remove, keys -----------------------------------------------------------------
    def meta(self, key: bytes) -> ChunkMeta | None:
        key = validate_key(key)
        self._ensure_scanned()
        if not self.is_shared:
            with self._lock:
                return self._index.get(key)
        found = self._scan_chunk(self.chunk_path(key), key)
        self._record(key, None if found is None else found[1])
        return None if found is None else found[1]

    def remove(self, key: bytes) -> bool:
        key = validate_key(key)
        self._ensure_scanned()
        with self._key_lock(key):
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
            return iter(list(self._index.items()))  # type: ignore[arg-type]  # only bytes keys go in

    def _ensure_scanned(self) -> None:
        if not self._scanned:
            self._rescan(only_first=True)

    def _rescan(self, only_first: bool = False) -> None:
        with self._scan_lock:
            if only_first and self._scanned:
                return
            with self._lock:
                self._journal = []
            found: KeyTable[ChunkMeta] = KeyTable()  # built outside the lock; the journal's changes go on top
            for key, meta in self._scan_tree():
                found.put(key, meta)
            with self._lock:
                for key, change in self._journal:
                    if change is None:
                        found.pop(key)
                    else:
                        found.put(key, change)
                self._journal = None
                self._index = found
                self._committed_bytes = sum(self.footprint(meta.stored_bytes) for meta in found.values())
                self._scanned = True
        if self._committed_bytes > self.capacity_bytes:
            # A store evicts down to capacity right after its recovery scan (kvstore/store/recovery.py).
            logger.info("%s at %s holds %d bytes, over its capacity of %d; puts fail until chunks are evicted",
                        type(self).__name__, self.root, self._committed_bytes, self.capacity_bytes)

    def _scan_tree(self) -> Iterator[tuple[bytes, ChunkMeta]]:
        for entry in chunk_files.iter_tree(self.root):
            if entry.name.endswith(chunk_files.TEMP_SUFFIX):
                chunk_files.remove_if_stale(entry, self._start_time - self.stale_temp_grace_s, self._temp_tag)
                continue
            key = chunk_files.key_of_chunk_name(entry.name)
            found = None if key is None else self._scan_chunk(entry.path, key)
            if found is not None:
                yield found

    def _scan_chunk(self, path: str, key: bytes) -> tuple[bytes, ChunkMeta] | None:
        try:
            header = chunk_files.scan_header(path, key)
        except CorruptChunkError as exc:
            with self._lock:
                self.num_corrupt_dropped += 1
            logger.warning("%s dropped corrupt chunk %s during scan: %s", type(self).__name__, path, exc)
            return None
        return None if header is None else (key, shared_meta(chunk_files.meta_of(header)))

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
        with self._lock:
            return len(self._index)


def _wait_all(futures: list[Future]) -> list:
    """Wait for every future (no I/O still writing into caller buffers), then raise the first error."""
    wait(futures)
    return [future.result() for future in futures]
