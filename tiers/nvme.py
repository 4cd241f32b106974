"""`NVMeTier`: chunk files on a local disk owned by this process, O_DIRECT on a thread pool, kvikio for GPU tensors.

The directory belongs to one process (an exclusive flock on `<dir>/.kvstore.lock`, tiers/dir_lock.py,
refuses a second owner naming the holder's PID): its in-memory index (rebuilt from the chunk headers on
first use and by `keys()`) is authoritative, so a miss costs no system call. To share a
directory between processes or nodes use `PFSTier`, which checks the files instead.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from kvstore.chunk_format import PAYLOAD_OFFSET, ChunkHeader, payload_checksum, round_up, verify_payload
from kvstore.errors import ConfigError, CorruptChunkError
from kvstore.types import ChunkMeta, TierKind
from tiers import chunk_files, file_io
from tiers.base import check_out
from tiers.dir_lock import DirLock
from tiers.file_tier import FileTier
from tiers.registry import register_tier

logger = logging.getLogger(__name__)


@register_tier
class NVMeTier(FileTier):
    """Chunks as files on local NVMe.

    Args:
        path: directory (created if missing); one chunk per file under fan-out subdirectories.
        capacity_bytes: budget for chunk files (`footprint(n)` = 4 KiB header block + n padded to 4 KiB).
        num_workers: threads of the pool behind submit_put/submit_get/put_many/get_many.
        use_kvikio: None = use kvikio for CUDA tensors when it imports and the CUDA driver loads;
            True = require it (ConfigError otherwise); False = never.
        direct_io: open files with O_DIRECT (falls back to buffered I/O, with a warning, where the
            filesystem refuses it).
        sync_writes: fsync each chunk file and its directory before put returns (see tiers/file_tier.py).
    """

    kind = TierKind.NVME

    def __init__(self, *, path: str | os.PathLike, capacity_bytes: int, num_workers: int = 4,
                 use_kvikio: bool | None = None, direct_io: bool = True, sync_writes: bool = False) -> None:
        super().__init__(path=path, capacity_bytes=capacity_bytes, num_workers=num_workers,
                         direct_io=direct_io, sync_writes=sync_writes)
        try:
            self._kvikio = _resolve_kvikio(use_kvikio, self.root)
            # One owner per directory: two processes rewriting one index would corrupt each other's view.
            self._dir_lock: DirLock | None = DirLock(self.root, what="tier nvme")
        except BaseException:
            super().close()
            raise

    def close(self) -> None:
        super().close()
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None

    @property
    def uses_kvikio(self) -> bool:
        return self._kvikio is not None

    @property
    def supports_device_io(self) -> bool:
        """kvikio (GPUDirect Storage) reads a chunk file straight into a CUDA buffer."""
        return self.uses_kvikio

    # ---- kvikio path for CUDA tensors (not exercised on CPU-only machines: no libcuda here) ----
    def _write_file(self, temp: str, key: bytes, payload: torch.Tensor, meta: ChunkMeta) -> None:
        if self._kvikio is None or payload.device.type != "cuda":
            return super()._write_file(temp, key, payload, meta)
        # The xxh3 checksum is computed on host bytes, so one device-to-host copy stays on this path.
        nbytes = payload.numel()
        header = ChunkHeader(codec_id=meta.codec_id, layout_fingerprint=meta.layout_fingerprint, key=key,
                             raw_bytes=meta.raw_bytes, stored_bytes=nbytes,
                             payload_checksum=payload_checksum(file_io.as_buffer(payload.cpu())))
        with open(temp, "xb") as file:
            file.write(header.pack())
            file.truncate(PAYLOAD_OFFSET + round_up(nbytes))
        with self._kvikio.CuFile(temp, "r+") as cufile:
            cufile.write(payload, size=nbytes, file_offset=PAYLOAD_OFFSET)
        if self.sync_writes:
            with open(temp, "rb") as file:
                os.fsync(file.fileno())
        return None

    def _read_chunk(self, fd: int, key: bytes, out: torch.Tensor, *, direct: bool, expected_bytes: int | None,
                    on_ready: Callable[[int], None] | None = None) -> ChunkHeader:
        if self._kvikio is None or out.device.type != "cuda":
            return super()._read_chunk(fd, key, out, direct=direct, expected_bytes=expected_bytes, on_ready=on_ready)
        header = chunk_files.read_header(fd, key, direct=direct)
        check_out(out, header.stored_bytes)
        nbytes = header.stored_bytes
        with self._kvikio.CuFile(f"/proc/self/fd/{fd}", "r") as cufile:  # the inode we opened, not a newer one
            got = cufile.read(out[:nbytes], size=nbytes, file_offset=PAYLOAD_OFFSET)
        if got < nbytes:
            raise CorruptChunkError(f"chunk {header.key.hex()} is truncated: {got} payload bytes, header says {nbytes}")
        verify_payload(header, file_io.as_buffer(out[:nbytes].cpu()))
        if on_ready is not None:
            on_ready(nbytes)
        return header


def _resolve_kvikio(use_kvikio: bool | None, root: str) -> Any:
    """The kvikio module when it should be used, else None; logs one line saying which path is used."""
    if use_kvikio is False:
        logger.info("NVMe tier at %s: kvikio disabled by config; NVMe tier uses POSIX O_DIRECT", root)
        return None
    module, reason = _load_kvikio()
    if module is None:
        if use_kvikio:
            raise ConfigError(f"use_kvikio=True but kvikio is unavailable ({reason}); install the 'gpu' extra "
                              "(pip install 'kvstore[gpu]') on a machine with the CUDA driver, or set use_kvikio=None")
        logger.info("kvikio unavailable (%s): NVMe tier uses POSIX O_DIRECT", reason)
        return None
    logger.info("NVMe tier at %s uses kvikio for CUDA tensors (GPUDirect Storage where the driver allows, "
                "kvikio's POSIX mode otherwise) and POSIX O_DIRECT for host tensors", root)
    return module


def _load_kvikio() -> tuple[Any, str]:
    try:
        import kvikio  # optional extra: kvstore[gpu]
    except Exception as exc:  # ImportError, or a CUDA library error raised at import
        return None, f"{type(exc).__name__}: {exc}"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return None, f"CUDA driver not loadable: {exc}"
    return kvikio, ""
