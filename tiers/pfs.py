"""`PFSTier`: chunk files in a directory shared by many processes and nodes (Lustre, GPFS, BeeGFS, CephFS, NFS).

Every process writes through temp name + rename, so a reader on any node sees a whole chunk or
none. `contains`/`meta`/`get_into` look at the file system, not only at this process's index, so
a chunk another process or node wrote is a hit here, and one it removed is a miss.

`used_bytes` is this process's view: the files it wrote, read, looked up or listed with `keys()`
(no scan of the shared tree at start, which could hold millions of files). Other writers' bytes
count here only once this process has seen them; size `capacity_bytes` as this process's share.
"""

from __future__ import annotations

import logging
import os

from kvstore.types import TierKind
from tiers.file_tier import FileTier
from tiers.registry import register_tier

logger = logging.getLogger(__name__)


@register_tier
class PFSTier(FileTier):
    """Chunks as files on a shared parallel filesystem.

    Args:
        path: the shared directory (created if missing); fan-out subdirectories root/ab/cd/.
        capacity_bytes: this process's budget (see the module docstring on `used_bytes`).
        num_workers: threads of the pool behind submit_put/submit_get/put_many/get_many.
        direct_io: False by default: many parallel filesystems reject O_DIRECT or make it slow, and
            their clients already do large buffered I/O well. True tries O_DIRECT (falls back with a warning).
        sync_writes: fsync file and directory before put returns (see tiers/file_tier.py).
    """

    kind = TierKind.PFS
    is_shared = True
    scan_on_open = False
    # Another node's write in progress can look old to us (clock skew, slow clients): leave it alone.
    stale_temp_grace_s = 900.0

    def __init__(self, *, path: str | os.PathLike, capacity_bytes: int, num_workers: int = 4,
                 direct_io: bool = False, sync_writes: bool = False) -> None:
        super().__init__(path=path, capacity_bytes=capacity_bytes, num_workers=num_workers,
                         direct_io=direct_io, sync_writes=sync_writes)
        logger.info("PFS tier at %s: shared directory, %s I/O", self.root, "O_DIRECT" if direct_io else "buffered")
