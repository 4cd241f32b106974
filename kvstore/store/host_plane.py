"""Zero-copy access to the host tier for a colocated engine: reserve/commit writes, leased reads.

    writer: reserve(key) -> slot offset ; fill shm[offset:offset+n] ; commit(res)  (or abort)
    reader: acquire(key) -> slot offset ; copy shm[offset:offset+n] out ; release(lease)

A reserved or leased slot is never evicted or reused. Expiring leases of dead clients is the
daemon's job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kvstore.errors import ConfigError, TierFullError
from kvstore.hashing import validate_key
from kvstore.types import ChunkMeta, PutResult, TierKind
from policies.eviction import AccessInfo

if TYPE_CHECKING:
    from kvstore.store.tiered_store import TieredStore


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

    def __init__(self, store: TieredStore) -> None:
        self.store = store
        self.level = store.levels[0]
        arena = self.level.tier.as_arena()
        if self.level.kind is not TierKind.HOST or self.level.config.codec != "none" or arena is None:
            raise ConfigError("the zero-copy data plane needs an uncompressed host tier as the store's top tier")
        self.tier = arena

    @property
    def shm_name(self) -> str | None:
        return self.tier.shm_name

    def reserve(self, key: bytes) -> Reservation:
        key = validate_key(key)
        nbytes = self.store.layout.chunk_bytes
        deadline = time.monotonic() + self.store.config.put_timeout_s
        while True:
            self.store.mover.make_room(self.level, nbytes, deadline)
            try:
                return Reservation(key, self.tier.reserve(nbytes), nbytes)
            except TierFullError:
                if time.monotonic() >= deadline:
                    raise

    def commit(self, reservation: Reservation) -> PutResult:
        layout = self.store.layout
        meta = ChunkMeta(codec_id=0, raw_bytes=reservation.nbytes, stored_bytes=reservation.nbytes,
                         layout_fingerprint=layout.fingerprint)
        self.tier.commit(reservation.key, reservation.offset, meta)
        info = AccessInfo(size_bytes=reservation.nbytes)
        self.store.mover.record_stored(self.level, reservation.key, meta, info)
        self.store.stats_counters.incr("puts")
        result = PutResult(stored=[reservation.key])
        deadline = time.monotonic() + self.store.config.put_timeout_s
        self.store.mover.enqueue_replicas(reservation.key, info, deadline, result)
        return result

    def abort(self, reservation: Reservation) -> None:
        self.tier.abort(reservation.offset)

    def acquire(self, key: bytes) -> Lease | None:
        """Lease the host copy of `key`, promoting it from a disk tier first when needed."""
        key = validate_key(key)
        for _ in range(2):
            held, found = self.store.index.lease_if_held(key, self.level.index, lambda: self.tier.acquire(key))
            if not held:
                return None
            if found is not None:
                return Lease(key, found[0], found[1].stored_bytes)
            scratch = torch.empty(self.store.layout.chunk_shape, dtype=self.store.layout.torch_dtype)
            if not self.store.get(key, scratch):  # a disk read promotes into the host tier
                return None
        return None

    def release(self, lease: Lease) -> None:
        self.tier.release_slot(lease.key, lease.offset)
        self.store.index.unpin([lease.key])
