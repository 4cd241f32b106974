"""The daemon's memory by component: host tier, index and per-chunk state, buffers and segments, the rest of its RSS."""

from __future__ import annotations

import os
from collections.abc import Mapping

from kvstore.store.memory_model import LEDGER_ENTRY_BYTES
from service.backend import Backend

COMPONENTS = ("host_tier", "index_and_chunk_state", "buffers_and_segments", "rest")


def rss_bytes() -> int:
    """This process's resident set (0 where /proc cannot say)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def daemon_memory(backend: Backend, store_memory: Mapping[str, int]) -> dict[str, int]:
    """`<component>_bytes` for each of COMPONENTS, and `rss_bytes`. The store's part (`TieredStore.stats()`
    `memory`) gains the tenant ledgers' entries; buffers and segments are what the memory budgets charge
    (segments, request staging) and the parked response buffers; the rest is RSS less the others
    (the interpreter, libraries, torch, threads' stacks, allocator slack)."""
    rss = rss_bytes()
    ledgers = sum(t.num_chunks for t in backend.ledger.tenants) * LEDGER_ENTRY_BYTES
    parts = {"host_tier_bytes": store_memory.get("host_tier_bytes", 0),
             "index_and_chunk_state_bytes": store_memory.get("index_and_chunk_state_bytes", 0) + ledgers,
             "buffers_and_segments_bytes": backend.memory.total() + backend.response_buffers.parked_bytes}
    return {"rss_bytes": rss, **parts, "rest_bytes": max(0, rss - sum(parts.values()))}
