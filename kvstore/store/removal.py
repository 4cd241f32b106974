"""`remove_everywhere`: a chunk deleted from every tier, the index kept true to what the disks still hold."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from kvstore.errors import KVStoreError
from kvstore.hashing import ChunkKey
from kvstore.store.index import ChunkIndex
from kvstore.store.levels import Level
from kvstore.types import TierKind
from policies.eviction import AccessInfo

logger = logging.getLogger(__name__)


def remove_everywhere(levels: Sequence[Level], index: ChunkIndex, key: ChunkKey,
                      emit: Callable[[str, ChunkKey, TierKind], None]) -> bool:
    """Delete `key` from every tier; True when any tier held it. A tier that fails to delete its copy keeps it in
    the index (the index never claims less than the disk holds, so nothing comes back at restart) and the error
    is raised after the other tiers are done. A shared tier (a PFS) may hold the key without the index knowing:
    it is asked too."""
    where = index.pop(key)
    held = list(where)
    removed = False
    failed: list[tuple[int, KVStoreError]] = []
    for level_index in held:
        try:
            removed |= levels[level_index].tier.remove(key)
        except KVStoreError as exc:
            failed.append((level_index, exc))
            continue
        emit("removed", key, levels[level_index].kind)
    for level in levels:
        if level.tier.is_shared and level.index not in held:
            try:
                removed |= level.tier.remove(key)
            except KVStoreError as exc:
                logger.warning("remove from shared %s tier failed: %s", level.name, exc)
    for level_index, _ in failed:  # the copy is still on that tier: the index says so again
        meta = where[level_index]
        index.add_location(levels[level_index], key, meta, AccessInfo(size_bytes=meta.stored_bytes))
    if failed:
        raise failed[0][1]
    return removed
