"""Cluster-wide PFS eviction, done by one node at a time: the holder of the PFS eviction lease.

Every node's store only sees its own share of the shared directory; the leader looks at all of
it (a header scan), and deletes the least recently written chunk files (the tails of old chains
first, see `eviction_order`) until the directory is back under its budget. Other nodes then read those chunks as misses (the PFS tier's contract).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstore.cluster.lease import RedisLease
from kvstore.types import TierKind
from tiers.file_tier import FileTier

if TYPE_CHECKING:
    from kvstore.store.tiered_store import TieredStore

logger = logging.getLogger(__name__)

MTIME_BUCKET_S = 10.0


@dataclass(frozen=True, slots=True)
class EvictionPass:
    """What one pass did: whether this node led it, bytes seen before, chunks and bytes removed."""

    led: bool
    used_bytes: int = 0
    num_removed: int = 0
    removed_bytes: int = 0


def evict_pfs(store: TieredStore, lease: RedisLease, budget_bytes: int) -> EvictionPass:
    """If this node can take the lease: evict the oldest PFS chunks until the directory fits `budget_bytes`.

    Returns at once with led=False when another node holds the lease. Stops early if the lease is lost.
    """
    tier = next((lv.tier for lv in store.levels if lv.kind is TierKind.PFS), None)
    if not isinstance(tier, FileTier):
        return EvictionPass(led=False)
    with lease.hold() as held:
        if not held:
            return EvictionPass(led=False)
        files = [(key, tier.footprint(meta.stored_bytes), _mtime(tier.chunk_path(key))) for key, meta in tier.keys()]
        used = sum(size for _, size, _ in files)
        removed = removed_bytes = 0
        for key, size, _ in sorted(files, key=lambda item: eviction_order(item[2])):
            if used - removed_bytes <= budget_bytes or lease.lost.is_set():
                break
            if tier.remove(key):
                store.emit("removed", key, TierKind.PFS)
                removed += 1
                removed_bytes += size
        if removed:
            logger.info("PFS eviction by %s: removed %d chunks (%d MiB); directory %d -> %d MiB of %d MiB budget",
                        lease.owner, removed, removed_bytes >> 20, used >> 20, (used - removed_bytes) >> 20,
                        budget_bytes >> 20)
        return EvictionPass(led=True, used_bytes=used, num_removed=removed, removed_bytes=removed_bytes)


def eviction_order(mtime: float, bucket_s: float = MTIME_BUCKET_S) -> tuple[int, float]:
    """Oldest write bucket first; inside a bucket the newest file first. A prompt's chunks are written
    head first, so this drops the tails of old chains before their heads (a head alone is still a hit)."""
    return int(mtime // bucket_s), -mtime


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return 0.0
