"""`where_lines`: every place a store writes (data folders, lock files, shared memory, log), for
`kvstore serve` at start, `kvstore stats` and `kvstore store-demo`, so nothing is left unnamed."""

from __future__ import annotations

import os

from kvstore.config import StoreConfig
from kvstore.redact import redact_url
from kvstore.types import TierKind


def where_lines(config: StoreConfig, *, shm_name: str | None, log: str | None = "stderr") -> list[str]:
    """One line per place the store writes: disk tier folders (and lock files), shared memory, log."""
    lines = []
    for tier in config.tiers:
        if tier.kind in (TierKind.NVME, TierKind.PFS) and tier.path:
            lock = f" (lock {os.path.join(tier.path, '.kvstore.lock')})" if tier.kind is TierKind.NVME else ""
            lines.append(f"data {tier.kind.value}: {os.path.abspath(tier.path)}{lock}")
        elif tier.kind is TierKind.REDIS:
            lines.append(f"data redis: {redact_url(str(tier.options.get('url', 'redis://127.0.0.1:6379/0')))}")
    if shm_name:
        lines.append(f"shared memory: /dev/shm/{shm_name} (host tier arena, removed at exit)")
    if log is not None:
        lines.append(f"log: {log}")
    return lines
