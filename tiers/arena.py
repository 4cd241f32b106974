"""`ArenaTier`: chunk payloads in slots of one preallocated memory arena (host RAM or a device).

Readers take a lease on a slot (a reader count); a removed slot is freed only when its last
lease ends, so a slot being copied out is never reused underneath the reader.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from kvstore.errors import TierFullError
from kvstore.key_table import key_map
from kvstore.types import ChunkMeta, shared_meta
from tiers.allocator import SlotAllocator
from tiers.base import Tier, check_out, check_payload
from tiers.byte_copy import copy_bytes

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Slot:
    offset: int
    meta: ChunkMeta
    readers: int = 0
    dead: bool = False


class ArenaTier(Tier):
    """A memory tier: one arena tensor, a slot allocator, and leases for readers."""

    is_memory = True

    def __init__(self, *, capacity_bytes: int, arena: torch.Tensor | None = None, device: str = "cpu",
                 align: int = 256) -> None:
        super().__init__(capacity_bytes=capacity_bytes)
        self.arena = arena if arena is not None else torch.empty(capacity_bytes, dtype=torch.uint8, device=device)
        self._alloc = SlotAllocator(self.arena.numel(), align=align)
        self._slots: dict[bytes, _Slot] = key_map()  # one per chunk held: compact (KeyIndex) where built
        self._dead: dict[int, _Slot] = {}  # removed slots still under a read lease, by offset
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
                self._alloc.free(offset)
            raise
        with self._lock:
            old = self._slots.get(key)
            self._slots[key] = _Slot(offset, shared_meta(meta))
            if old is not None:
                self._release_dead(old)

    def _release_dead(self, slot: _Slot) -> None:
        slot.dead = True
        if slot.readers == 0:
            self._alloc.free(slot.offset)
        else:
            self._dead[slot.offset] = slot  # freed by the last reader

    # ----- zero-copy access for a shared-memory data plane -----------------------------------
    def reserve(self, nbytes: int) -> int:
        """Reserve a slot for a writer that fills it in place; `commit` or `abort` it later."""
        with self._lock:
            offset = self._alloc.allocate(nbytes)
        if offset is None:
            raise TierFullError(f"{type(self).__name__}: no hole of {nbytes} bytes to reserve; evict first")
        return offset

    def commit(self, key: bytes, offset: int, meta: ChunkMeta) -> None:
        """Publish a reserved slot, filled by the writer, under `key`."""
        with self._lock:
            old = self._slots.get(key)
            self._slots[key] = _Slot(offset, shared_meta(meta))
            if old is not None:
                self._release_dead(old)

    def abort(self, offset: int) -> None:
        with self._lock:
            self._alloc.free(offset)

    def acquire(self, key: bytes) -> tuple[int, ChunkMeta] | None:
        """Take a read lease on a slot: (offset, meta); the slot is not reused until `release_slot`."""
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                return None
            slot.readers += 1
            return slot.offset, slot.meta

    def release_slot(self, key: bytes, offset: int) -> None:
        with self._lock:
            slot = self._slots.get(key)
            if slot is None or slot.offset != offset:
                slot = self._dead.get(offset)
            if slot is None:
                return
            slot.readers -= 1
            if slot.dead and slot.readers == 0:
                self._alloc.free(slot.offset)
                self._dead.pop(slot.offset, None)

    def slot_view(self, offset: int, nbytes: int) -> torch.Tensor:
        return self.arena[offset : offset + nbytes]

    @contextmanager
    def lease(self, key: bytes) -> Iterator[tuple[torch.Tensor, ChunkMeta] | None]:
        """Zero-copy view of a slot's payload, valid until the `with` block ends (None on a miss)."""
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                yield None
                return
            slot.readers += 1
        try:
            yield self.arena[slot.offset : slot.offset + slot.meta.stored_bytes], slot.meta
        finally:
            with self._lock:
                slot.readers -= 1
                if slot.dead and slot.readers == 0:
                    self._alloc.free(slot.offset)
                    self._dead.pop(slot.offset, None)

    def get_into(self, key: bytes, out: torch.Tensor) -> int | None:
        with self.lease(key) as found:
            if found is None:
                return None
            view, meta = found
            check_out(out, meta.stored_bytes)
            copy_bytes(out[: meta.stored_bytes], view)
            return meta.stored_bytes

    def meta(self, key: bytes) -> ChunkMeta | None:
        slot = self._slots.get(key)
        return None if slot is None else slot.meta

    def remove(self, key: bytes) -> bool:
        with self._lock:
            slot = self._slots.pop(key, None)
            if slot is None:
                return False
            self._release_dead(slot)
            return True

    def keys(self) -> Iterator[tuple[bytes, ChunkMeta]]:
        with self._lock:
            items = [(key, slot.meta) for key, slot in self._slots.items()]
        return iter(items)

    def __len__(self) -> int:
        return len(self._slots)
