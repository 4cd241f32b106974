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

from kvstore.errors import ConfigError, TierFullError
from kvstore.hashing import validate_key
from kvstore.types import ChunkMeta, PutResult, TierKind
from policies.eviction import AccessInfo

if TYPE_CHECKING:
    from kvstore.config import StoreConfig
    from kvstore.stats import Counters
    from kvstore.store.index import ChunkIndex
    from kvstore.store.levels import Level
    from kvstore.store.mover import Mover
    from tiers.base import Arena


def raw_host_arena(level: Level) -> Arena | None:
    """The arena of `level` when it holds chunks raw in host memory (what this plane shares), else None."""
    arena = level.tier.as_arena()
    return arena if level.kind is TierKind.HOST and level.config.codec == "none" else None


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

    def __init__(self, top: Level, config: StoreConfig, index: ChunkIndex, mover: Mover, stats: Counters, *,
                 read: Callable[[bytes, torch.Tensor], bool]) -> None:
        """`top` is the store's top level; `read(key, out)` is the store's get (it promotes a disk
        chunk into the top level)."""
        self.config = config
        self.layout = config.layout
        self.index = index
        self.mover = mover
        self.stats = stats
        self._read = read
        self.level = top
        arena = raw_host_arena(top)
        if arena is None:
            raise ConfigError("the zero-copy data plane needs an uncompressed host tier as the store's top tier")
        self.tier = arena

    @property
    def shm_name(self) -> str | None:
        return self.tier.shm_name

    def reserve(self, key: bytes) -> Reservation:
        key = validate_key(key)
        nbytes = self.layout.chunk_bytes
        deadline = time.monotonic() + self.config.put_timeout_s
        while True:
            self.mover.make_room(self.level, nbytes, deadline)
            try:
                return Reservation(key, self.tier.reserve(nbytes), nbytes)
            except TierFullError:
                if time.monotonic() >= deadline:
                    raise

    def commit(self, reservation: Reservation) -> PutResult:
        layout = self.layout
        meta = ChunkMeta(codec_id=0, raw_bytes=reservation.nbytes, stored_bytes=reservation.nbytes,
                         layout_fingerprint=layout.fingerprint)
        self.tier.commit(reservation.key, reservation.offset, meta)
        info = AccessInfo(size_bytes=reservation.nbytes)
        self.mover.record_stored(self.level, reservation.key, meta, info)
        self.stats.incr("puts")
        result = PutResult(stored=[reservation.key])
        deadline = time.monotonic() + self.config.put_timeout_s
        self.mover.enqueue_replicas(reservation.key, info, deadline, result)
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
