"""Recovery: a new store over existing directories rebuilds its index from the chunk headers, then fits its capacity."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstore.errors import KVStoreError
from policies.eviction import AccessInfo

if TYPE_CHECKING:
    from kvstore.stats import Counters
    from kvstore.store.index import ChunkIndex
    from kvstore.store.layouts import LayoutSet
    from kvstore.store.levels import Level
    from kvstore.store.mover import Mover

logger = logging.getLogger(__name__)
VICTIMS_PER_ROUND = 64


def rebuild_index(levels: Sequence[Level], layouts: LayoutSet, index: ChunkIndex, stats: Counters) -> None:
    """Index every chunk the disk tiers hold (their headers). A store open to every layout indexes the
    chunks of all of them (each header names its layout, so a chunk is served only into a buffer of that
    layout); a fixed store's other-layout chunks are never served but stay evictable, so they cannot pin
    capacity."""
    foreign = 0
    for level in levels:
        if level.tier.is_memory:
            continue
        for key, meta in level.tier.keys():
            if layouts.fixed is not None and meta.layout_fingerprint != layouts.fixed.fingerprint:
                # Another model's chunk: never served, but evictable so it cannot pin capacity.
                foreign += 1
                level.eviction.on_insert(key, AccessInfo(size_bytes=meta.stored_bytes))
                continue
            index.add_location(level, key, meta, AccessInfo(size_bytes=meta.stored_bytes))
    if foreign:
        logger.info("recovery: skipped %d chunks written for another layout", foreign)
        stats.incr("foreign_chunks", foreign)
    stats.incr("recovered_chunks", len(index))


def evict_to_capacity(levels: Sequence[Level], index: ChunkIndex, mover: Mover) -> None:
    """A level holding more than its capacity (capped at a restart, or lowered in the config) evicts
    down to it through its own policy, as a full level does for a put: victims with no copy below are
    demoted first. Top to bottom, so what a level demotes lands before the level below is fitted."""
    for level in levels:
        over = level.tier.used_bytes - level.tier.capacity_bytes
        if over <= 0:
            continue
        try:
            evicted = _evict_down(level, index, mover)
        except KVStoreError as exc:  # e.g. a file that cannot be deleted now: serve anyway, puts evict later
            logger.warning("recovery: %s could not evict down to its capacity of %d bytes: %s",
                           level.name, level.tier.capacity_bytes, exc)
            continue
        logger.info("recovery: %s held %d bytes over its capacity of %d bytes: evicted %d chunks",
                    level.name, over, level.tier.capacity_bytes, evicted)


def _evict_down(level: Level, index: ChunkIndex, mover: Mover) -> int:
    tier, evicted = level.tier, 0
    while tier.used_bytes > tier.capacity_bytes:
        progress = 0
        for key in index.victims(level, VICTIMS_PER_ROUND):
            progress += mover.evict(level, key, reason="capacity")
            if tier.used_bytes <= tier.capacity_bytes:
                break
        if not progress:  # nothing left that may go (nothing is pinned before the store serves)
            logger.warning("recovery: %s holds %d bytes over its capacity of %d and has no victim left",
                           level.name, tier.used_bytes - tier.capacity_bytes, tier.capacity_bytes)
            break
        evicted += progress
    return evicted
