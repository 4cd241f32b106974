"""`HostBatch`: a get's or put's chunks copied out of or into a raw host arena with one `copy_many`.

    get: acquire every slot ─> copy_many(outs, slots) ─> release ─> hits, bytes_read
    put: reserve slots tail first ─> copy_many(slots, chunks) ─> commit tail first (or abort)

Each copy thread takes whole chunks across the batch instead of every chunk being sliced over the
threads and waited for (tiers/byte_copy.py has the figures). Everything else, accounting included,
is what `Mover.read_level` and `Mover.put_top` do for one chunk.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from kvstore.errors import KVStoreError, TierFullError
from kvstore.types import ChunkMeta, PutResult, TierKind
from tiers.byte_copy import copy_many

if TYPE_CHECKING:
    from kvstore.layout import KVLayout
    from kvstore.stats import Counters
    from kvstore.store.index import ChunkIndex
    from kvstore.store.levels import Level
    from kvstore.store.mover import Mover
    from policies.eviction import AccessInfo
    from tiers.base import Arena


def raw_host_arena(level: Level) -> Arena | None:
    """The arena of `level` when it holds chunks raw in host memory (what HostBatch needs), else None."""
    arena = level.tier.as_arena()
    return arena if level.kind is TierKind.HOST and level.config.codec == "none" else None


class HostBatch:
    """Batched copies for the store's top level, an uncompressed host arena (`raw_host_arena`)."""

    def __init__(self, top: Level, arena: Arena, index: ChunkIndex, mover: Mover, stats: Counters) -> None:
        self.level = top
        self.arena = arena
        self.index = index
        self.mover = mover
        self.stats = stats

    def can_put(self, raws: Sequence[torch.Tensor]) -> bool:
        """Whether a put batch may reserve all its slots before storing any: two or more CPU chunks that
        fit in the tier's free bytes now or take at most half of it, so making room for one never evicts
        another of the batch (a tier too small for a chain keeps its head because the per-chunk path
        inserts the tail first)."""
        if len(raws) < 2 or any(raw.device.type != "cpu" for raw in raws):
            return False
        tier = self.level.tier
        batch_bytes = sum(tier.footprint(raw.numel()) for raw in raws)
        return 2 * batch_bytes <= tier.capacity_bytes or batch_bytes <= tier.capacity_bytes - tier.used_bytes

    # ----- get -------------------------------------------------------------------------------
    def read(self, keys: Sequence[bytes], outs: Sequence[torch.Tensor], layouts: Sequence[KVLayout],
             jobs: list[int]) -> list[bool]:
        """Read `keys[i]` into `outs[i]` (raw chunk bytes of `layouts[i]`) for each i in `jobs`, held by this
        level; one bool per job, False a miss, accounted as `Mover.read_level` does."""
        slots: list[tuple[int, tuple[int, ChunkMeta]]] = []
        hit = [False] * len(jobs)
        try:
            for j, i in enumerate(jobs):
                found = self._acquire(keys[i], outs[i], layouts[i])
                if found is not None:
                    slots.append((j, found))
                elif self.index.meta(keys[i], self.level.index)[1] is not None:  # not raw, another layout: alone
                    hit[j] = self.mover.read_level(self.level.index, keys[i], outs[i], layouts[i])
            copy_many([outs[jobs[j]] for j, _ in slots],
                      [self.arena.slot_view(offset, meta.stored_bytes) for _, (offset, meta) in slots])
        finally:
            for j, (offset, _) in slots:
                self.arena.release_slot(keys[jobs[j]], offset)
        for j, (_, meta) in slots:
            hit[j] = True
            self.stats.incr(f"{self.level.name}.hits")
            self.stats.incr(f"{self.level.name}.bytes_read", meta.stored_bytes)
        return hit

    def _acquire(self, key: bytes, out: torch.Tensor, layout: KVLayout) -> tuple[int, ChunkMeta] | None:
        """A read lease on the raw slot of `key` sized for `out`; None for a miss or a chunk to read alone."""
        if self.index.meta(key, self.level.index)[1] is None:
            return None
        found = self.arena.acquire(key)
        if found is None:  # removed underneath the index: a miss, as Mover.read_level counts it
            self.stats.incr(f"{self.level.name}.vanished")
            self.mover.forget(self.level, key)
            return None
        offset, meta = found
        if meta.codec_id == 0 and meta.stored_bytes == out.numel() and out.device.type == "cpu" \
                and meta.layout_fingerprint == layout.fingerprint:
            return found
        self.arena.release_slot(key, offset)
        return None

    # ----- put -------------------------------------------------------------------------------
    @contextmanager
    def reserved(self, keys: Sequence[bytes], raws: Sequence[torch.Tensor], deadline: float,
                 result: PutResult) -> Iterator[dict[int, int]]:
        """Reserve a slot for each chunk not held yet, tail first, and copy the chunks into them; yields
        {chunk index: slot offset} for `commit` to pop. A chunk with no room by `deadline` is named in
        `result.not_stored`. Held chunks stay pinned meanwhile, so no reservation evicts them. Slots
        still in the dict when the block ends are aborted."""
        offsets: dict[int, int] = {}
        held = [key for key in keys if self.index.pin_prefix([key])]
        try:
            skip = set(held)
            for i in range(len(keys) - 1, -1, -1):
                offset = None if keys[i] in skip else self._reserve(keys[i], raws[i].numel(), deadline, result)
                if offset is not None:
                    offsets[i] = offset
                skip.add(keys[i])  # a key twice in the batch is stored once, as the per-chunk path does
            copy_many([self.arena.slot_view(offsets[i], raws[i].numel()) for i in offsets], [raws[i] for i in offsets])
            yield offsets
        finally:
            self.index.unpin(held)
            for offset in offsets.values():
                self.arena.abort(offset)

    def _reserve(self, key: bytes, nbytes: int, deadline: float, result: PutResult) -> int | None:
        try:
            return self.reserve_slot(nbytes, deadline)
        except KVStoreError as exc:
            result.not_stored[key] = str(exc)
            self.stats.incr("not_stored")
            return None

    def reserve_slot(self, nbytes: int, deadline: float) -> int:
        """Make room and reserve `nbytes` in the arena (another writer may take the room just made: try
        again until `deadline`). Raises TierFullError or the eviction's KVStoreError."""
        while True:
            self.mover.make_room(self.level, nbytes, deadline)
            try:
                return self.arena.reserve(nbytes)
            except TierFullError:
                if time.monotonic() >= deadline:
                    raise

    def commit(self, key: bytes, offset: int, info: AccessInfo, deadline: float, result: PutResult,
               layout: KVLayout) -> None:
        """Publish a filled slot, a chunk of `layout`, as `Mover.put_top` and the store's put_many would a
        copied chunk."""
        nbytes = info.size_bytes
        meta = ChunkMeta(codec_id=0, raw_bytes=nbytes, stored_bytes=nbytes, layout_fingerprint=layout.fingerprint)
        self.arena.commit(key, offset, meta)
        self.mover.record_stored(self.level, key, meta, info)
        self.stats.incr("puts")
        self.mover.enqueue_replicas(key, info, deadline, result)
