"""The get path's planning and its disk half: pin what is held, then spread disk-only chunks
over every replica tier with ReplicatedRead (results in prefix order)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvstore.hashing import ChunkKey
from kvstore.store.replicated_read import ReadJob, ReplicatedRead

if TYPE_CHECKING:
    from kvstore.store.tiered_store import TieredStore


def plan_reads(store: TieredStore, keys: list[ChunkKey]) -> tuple[list[ChunkKey], list[tuple[int, int]], list[int]]:
    """Pin every held key; split them into memory reads (index, level) and disk-only reads (index)."""
    pinned: list[ChunkKey] = []
    memory_jobs: list[tuple[int, int]] = []
    disk_jobs: list[int] = []
    with store._lock:
        for i, key in enumerate(keys):
            entry = store._index.get(key)
            fastest = entry.fastest() if entry else None
            if entry is None or fastest is None:
                continue
            entry.pins += 1
            pinned.append(key)
            if store.levels[fastest].tier.is_memory:
                memory_jobs.append((i, fastest))
            else:
                disk_jobs.append(i)
    return pinned, memory_jobs, disk_jobs


def read_from_disks(store: TieredStore, keys: list[ChunkKey], out_bytes: list[torch.Tensor], disk_jobs: list[int],
                    results: list[bool]) -> None:
    """Fill `results` for the disk-only chunks, each read by whichever replica tier is free first."""
    with store._lock:  # a chunk removed since planning has no levels left: a miss
        jobs = [ReadJob(key=keys[i], levels={lv for lv in getattr(store._index.get(keys[i]), "where", {})
                                             if not store.levels[lv].tier.is_memory})
                for i in disk_jobs]

    def read(level_index: int, job_index: int) -> bool:
        i = disk_jobs[job_index]
        return store._mover.read_level(level_index, keys[i], out_bytes[i], promote=True)

    plan = ReplicatedRead(jobs, read, store._read_pool, store.config.readers_per_tier).start()
    for job_index, ok in plan.results():
        results[disk_jobs[job_index]] = ok
