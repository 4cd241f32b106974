"""Recovery: a new store over existing directories rebuilds its index from the chunk headers."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from policies.eviction import AccessInfo

if TYPE_CHECKING:
    from kvstore.stats import Counters
    from kvstore.store.index import ChunkIndex
    from kvstore.store.layouts import LayoutSet
    from kvstore.store.levels import Level

logger = logging.getLogger(__name__)


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
