"""The get path's disk half: spread disk-only chunks over every replica tier with ReplicatedRead
(results in prefix order). The memory half and the pins are planned by `ChunkIndex.plan_reads`."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import torch

from kvstore.hashing import ChunkKey
from kvstore.store.replicated_read import ReadJob, ReplicatedRead

if TYPE_CHECKING:
    from kvstore.layout import KVLayout
    from kvstore.store.index import ChunkIndex
    from kvstore.store.mover import Mover


def read_from_disks(index: ChunkIndex, mover: Mover, pool: Executor, readers_per_tier: int, keys: Sequence[ChunkKey],
                    out_bytes: Sequence[torch.Tensor], layouts: Sequence[KVLayout], disk_jobs: list[int],
                    served: list[int | None]) -> None:
    """Fill `served` for the disk-only chunks (the level that read each, None for a miss), each read by
    whichever replica tier is free first.

    A chunk removed since planning has no levels left: a miss.
    """
    jobs = [ReadJob(key=keys[i], levels=index.disk_levels(keys[i])) for i in disk_jobs]
    # The readers run in the caller's inference mode: views made under torch.inference_mode (an
    # engine's forward context, e.g. vLLM's) may be written in place only inside that mode.
    inference = torch.is_inference_mode_enabled()

    def read(level_index: int, job_index: int) -> bool:
        i = disk_jobs[job_index]
        with torch.inference_mode(inference):
            ok = mover.read_level(level_index, keys[i], out_bytes[i], layouts[i], promote=True)
        if ok:  # each job is one reader's at a time: no two threads write the same slot
            served[i] = level_index
        return ok

    plan = ReplicatedRead(jobs, read, pool, readers_per_tier).start()
    for job_index, ok in plan.results():
        if not ok:
            served[disk_jobs[job_index]] = None
