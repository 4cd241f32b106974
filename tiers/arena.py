"""`ArenaTier`: chunk payloads in slots of one preallocated memory arena (host RAM or a device).

Readers take a lease on a slot (a reader count); a removed slot is freed only when its last
lease ends, so a slot being copied out is never reused underneath the reader.

A slot held costs one entry of a `KeyIndex` with unboxed int values (about 35 bytes; a dict where
there is no C build): key -> its offset in the arena (in units of the alignment) and its metadata's
id (`MetaIds`), packed in one integer. Its size is its metadata's stored size, rounded as the
allocator rounds it; read leases and removed slots still leased are kept by offset only while they
last, and reservations only until they are committed or aborted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kvstore.errors import TierFullError
from kvstore.key_table import key_map
from kvstore.types import ChunkMeta
from tiers.allocator import SlotAllocator
from tiers.base import Tier, check_out, check_payload
from tiers.byte_copy import copy_bytes
from tiers.meta_ids import MetaIds

logger = logging.getLogger(__name__)

META_BITS = 25  # a slot's packed value: offset // align << META_BITS | metadata id
META_MASK = (1 << META_BITS) - 1
MAX_OFFSET_UNITS = 1 << (63 - META_BITS)  # offsets in alignment units, so the value fits a signed 64-bit int


class ArenaTier(Tier):
    """A memory tier: one arena tensor, a slot allocator, and leases for readers."""

    is_memory = True

    def __init__(self, *, capacity_bytes: int, arena: torch.Tensor | None = None, device: str = "cpu",
                 align: int = 256) -> None:
        super().__init__(capacity_bytes=capacity_bytes)
        self.arena = arena if arena is not None else torch.empty(capacity_bytes, dtype=torch.uint8, device=device)
        self._alloc = SlotAllocator(self.arena.numel(), align=align)
        self._align = self._alloc.align
        if self._alloc.capacity_bytes // self._align >= MAX_OFFSET_UNITS:
            raise ValueError(f"{type(self).__name__}: an arena of {self._alloc.capacity_bytes:,} bytes has more than "
                             f"{MAX_OFFSET_UNITS:,} slots of {self._align} bytes; raise the alignment")
        self._slots: dict[bytes, int] = key_map(int_values=True)  # key -> packed offset and metadata id
        self._metas = MetaIds(META_MASK + 1)
        self._readers: dict[int, int] = {}  # offset -> read leases, while there are any
        self._dead: dict[int, int] = {}  # offset -> rounded size: removed slots still under a read lease
        self._reserved: dict[int, int] = {}  # offset -> bytes reserved, until commit or abort
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        return self._alloc.used_bytes

    def as_arena(self) -> ArenaTier:
        return self

    @property
    def shm_name(self) -> str | None:
        """The POSIX shared-memory name of the arena when other processes may map it, else None."""
        return None

    @property
    def device(self) -> torch.device:
        return self.arena.device

    def footprint(self, stored_bytes: int) -> int:
        return self._alloc.rounded(stored_bytes)

    def can_fit(self, stored_bytes: int) -> bool:
        with self._lock:
            return self._alloc.can_allocate(stored_bytes)

    def put(self, key: bytes, payload: torch.Tensor, meta: ChunkMeta) -> None:
        check_payload(payload)
        nbytes = payload.numel()
        _check_size(meta, nbytes)
        with self._lock:
            offset = self._alloc.allocate(nbytes)
            if offset is None:
                raise TierFullError(
                    f"{type(self).__name__}: no hole of {nbytes} bytes (used {self._alloc.used_bytes} of "
                    f"{self._alloc.capacity_bytes}, largest hole {self._alloc.largest_hole()}); evict first"
                )
        try:
            copy_bytes(self.arena[offset : offset + nbytes], payload)
        except BaseException:
            with self._lock:
                self._alloc.free(offset, nbytes)
            raise
        with self._lock:
            try:
                meta_id = self._metas.add(meta)
            except TierFullError:
                self._alloc.free(offset, nbytes)
                raise
            self._publish(key, offset, meta_id)

    def _publish(self, key: bytes, offset: int, meta_id: int) -> None:
        """Hold the filled slot at `offset` under `key` (the old slot of `key`, if any, is removed); `meta_id` is a
        use of its metadata's id, taken by the caller before anything else changed. Under the lock."""
        old = self._slots.get(key)
        self._slots[key] = offset // self._align << META_BITS | meta_id
        if old is not None:
            self._drop(old)

    def _unpack(self, value: int) -> tuple[int, ChunkMeta]:
        return (value >> META_BITS) * self._align, self._metas.get(value & META_MASK)

    def _drop(self, value: int) -> None:
        """A slot no longer held: freed now, or by its last reader. Under the lock."""
        offset, meta = self._unpack(value)
        self._metas.release(value & META_MASK)
        size = self._alloc.rounded(meta.stored_bytes)
        if offset in self._readers:
            self._dead[offset] = size
        else:
            self._alloc.free(offset, size)

    # ----- zero-copy access for a shared-memory data plane -----------------------------------
    def reserve(self, nbytes: int) -> int:
        """Reserve a slot for a writer that fills it in place; `commit` or `abort` it later."""
        with self._lock:
            offset = self._alloc.allocate(nbytes)
            if offset is not None:
                self._reserved[offset] = nbytes
        if offset is None:
            raise TierFullError(f"{type(self).__name__}: no hole of {nbytes} bytes to reserve; evict first")
        return offset

    def commit(self, key: bytes, offset: int, meta: ChunkMeta) -> None:
        """Publish a reserved slot, filled by the writer, under `key`.

        Raises:
            ValueError: `offset` is not reserved, or `meta.stored_bytes` is not the size reserved there (the
                reservation stays: abort it).
            TierFullError: the tier holds as many distinct metadata values as it can (the reservation stays).
        """
        with self._lock:
            reserved = self._reserved.get(offset)
            if reserved is None:
                raise ValueError(f"{type(self).__name__}: no slot is reserved at offset {offset}; reserve() first")
            _check_size(meta, reserved)
            meta_id = self._metas.add(meta)  # first: a refusal leaves the reservation to abort
            del self._reserved[offset]
            self._publish(key, offset, meta_id)

    def abort(self, offset: int) -> None:
        """Give back a reserved slot that will not be committed."""
        with self._lock:
            reserved = self._reserved.pop(offset, None)
            if reserved is None:
                raise ValueError(f"{type(self).__name__}: no slot is reserved at offset {offset}")
            self._alloc.free(offset, reserved)

    def acquire(self, key: bytes) -> tuple[int, ChunkMeta] | None:
        """Take a read lease on a slot: (offset, meta); the slot is not reused until `release_slot`."""
        with self._lock:
            value = self._slots.get(key)
            if value is None:
                return None
            offset, meta = self._unpack(value)
            self._readers[offset] = self._readers.get(offset, 0) + 1
            return offset, meta

    def release_slot(self, key: bytes, offset: int) -> None:
        """End a lease `acquire` gave on `key`'s slot at `offset` (the slot may have been removed since)."""
        with self._lock:
            readers = self._readers.get(offset)
            if readers is None:
                return
            if readers > 1:
                self._readers[offset] = readers - 1
                return
            del self._readers[offset]
            size = self._dead.pop(offset, None)
            if size is not None:
                self._alloc.free(offset, size)

    def slot_view(self, offset: int, nbytes: int) -> torch.Tensor:
        return self.arena[offset : offset + nbytes]

    @contextmanager
    def lease(self, key: bytes) -> Iterator[tuple[torch.Tensor, ChunkMeta] | None]:
        """Zero-copy view of a slot's payload, valid until the `with` block ends (None on a miss)."""
        found = self.acquire(key)
        if found is None:
            yield None
            return
        offset, meta = found
        try:
            yield self.arena[offset : offset + meta.stored_bytes], meta
        finally:
            self.release_slot(key, offset)

    def get_into(self, key: bytes, out: torch.Tensor) -> int | None:
        with self.lease(key) as found:
            if found is None:
                return None
            view, meta = found
            check_out(out, meta.stored_bytes)
            copy_bytes(out[: meta.stored_bytes], view)
            return meta.stored_bytes

    def meta(self, key: bytes) -> ChunkMeta | None:
        with self._lock:
            value = self._slots.get(key)
            return None if value is None else self._metas.get(value & META_MASK)

    def remove(self, key: bytes) -> bool:
        with self._lock:
            value = self._slots.pop(key, None)
            if value is None:
                return False
            self._drop(value)
            return True

    def keys(self) -> Iterator[tuple[bytes, ChunkMeta]]:
        with self._lock:
            items = [(key, self._metas.get(value & META_MASK)) for key, value in self._slots.items()]
        return iter(items)

    def __len__(self) -> int:
        return len(self._slots)


def _check_size(meta: ChunkMeta, nbytes: int) -> None:
    if meta.stored_bytes != nbytes:
        raise ValueError(f"chunk metadata says stored_bytes={meta.stored_bytes} but the slot holds {nbytes} bytes; "
                         "pass the metadata of the bytes stored")
