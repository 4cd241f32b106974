"""Zero-copy access to the host tier for a colocated engine: reserve/commit writes, leased reads.

    writer: reserve(key) -> slot offset ; fill shm[offset:offset+n] ; commit(res)  (or abort)
    reader: acquire(key) -> slot offset ; copy shm[offset:offset+n] out ; release(lease)

A reserved or leased slot is never evicted or reused. Expiring leases of dead clients is the
daemon's job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kvstore.errors import ConfigError
from kvstore.hashing import validate_key
from kvstore.types import PutResult
from policies.eviction import AccessInfo

if TYPE_CHECKING:
    from kvstore.config import StoreConfig
    from kvstore.store.host_batch import HostBatch
    from kvstore.store.index import ChunkIndex


@dataclass(frozen=True, slots=True)
class Reservation:
    key: bytes
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Lease:
    key: bytes
    offset: int
    nbytes: int


class HostPlane:
    """The store's host arena seen as shared slots."""

    def __init__(self, slots: HostBatch | None, config: StoreConfig, index: ChunkIndex, *,
                 read: Callable[[bytes, torch.Tensor], bool]) -> None:
        """`slots` reserves and commits in the store's top level (None when it is not an uncompressed host
        arena); `read(key, out)` is the store's get (it promotes a disk chunk into the top level)."""
        if slots is None:
            raise ConfigError("the zero-copy data plane needs an uncompressed host tier as the store's top tier")
        self.config = config
        self.layout = config.layout
        self.index = index
        self.slots = slots
        self._read = read
        self.level = slots.level
        self.tier = slots.arena

    @property
    def shm_name(self) -> str | None:
        return self.tier.shm_name

    def reserve(self, key: bytes) -> Reservation:
        key = validate_key(key)
        nbytes = self.layout.chunk_bytes
        return Reservation(key, self.slots.reserve_slot(nbytes, time.monotonic() + self.config.put_timeout_s), nbytes)

    def commit(self, reservation: Reservation) -> PutResult:
        result = PutResult(stored=[reservation.key])
        self.slots.commit(reservation.key, reservation.offset, AccessInfo(size_bytes=reservation.nbytes),
                          time.monotonic() + self.config.put_timeout_s, result, self.layout)
        return result

    def abort(self, reservation: Reservation) -> None:
        self.tier.abort(reservation.offset)

    def acquire(self, key: bytes) -> Lease | None:
        """Lease the host copy of `key`, promoting it from a disk tier first when needed."""
        key = validate_key(key)
        for _ in range(2):
            held, found = self.index.lease_if_held(key, self.level.index, lambda: self.tier.acquire(key))
            if not held:
                return None
            if found is not None:
                return Lease(key, found[0], found[1].stored_bytes)
            scratch = torch.empty(self.layout.chunk_shape, dtype=self.layout.torch_dtype)
            if not self._read(key, scratch):  # a disk read promotes into the host tier
                return None
        return None

    def release(self, lease: Lease) -> None:
        self.tier.release_slot(lease.key, lease.offset)
        self.index.unpin([lease.key])
