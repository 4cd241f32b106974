"""Chunk memory: the daemon's bytes per chunk held, by component, for a million chunks, beside 512 B.

What a held chunk costs the daemon is its per-chunk state: the key (one bytes object, shared by
every table), its `ChunkIndex` entry, its record in each tier holding it (the disk tier's metadata,
the host tier's slot: one packed int), the eviction policy's state for it (the tier's default
policy, at steady state: a full tier evicting, so the ghost lists are full too) and its tenant
ledger entry. The bench builds a real `TieredStore` (host + NVMe, the default policies) and a real
tenant, gives each component its state for N chunks through that component's own methods (the
disk tier's index without writing N files: a chunk file's bytes are not daemon memory), and
measures each with tracemalloc; the whole fill's RSS delta, in a run without tracemalloc, is the
cross-check (it adds the allocator's rounding).

    kvstore bench chunk_memory [--quick]            1,000,000 chunks (--quick: 100,000)
    python -m bench.chunk_memory --chunks 1000000 --json docs/bench/chunk_memory.json

Records: bytes per chunk held on disk only, and per chunk held in the host tier as well (its
slot and the host policy's state added), each beside the limit of 512 B; one record per component.
The policies are measured at steady state (three capacities inserted); the index, the disk tier and the
ledger after one fill, and again after every disk-only chunk was evicted and replaced once (a full tier's
steady state: a dict that keys come and go through is rebuilt with room for three times its keys, which is why
those tables are a KeyIndex and KeyTables, built not to grow under turnover).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Hashable
from pathlib import Path

from bench.common import Record, print_records, record
from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.store.levels import Level
from kvstore.types import ChunkMeta, TierKind
from policies.eviction import AccessInfo, EvictionPolicy
from policies.tier_policy import make_policy
from service.tenants import Tenant

LIMIT_BYTES = 512  # issue 43: at most this much daemon memory per chunk held in any tier
HOST_SHARE = 8  # the host tier holds one chunk in this many (its chunks are the hot ones)
# Metadata does not depend on the chunk's size; a small chunk keeps the host arena small (512 B).
LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=64, dtype="float16", chunk_tokens=2)
CHAIN = 64  # chunks per prompt: positions 0..CHAIN-1, as a store sees a chain
TURNOVER = "growth of index, disk tier and ledger over that turnover"


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _traced(fn: Callable[[], object]) -> int:
    """Bytes `fn` leaves allocated (tracemalloc's current size, after a collection)."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    fn()
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - before


class _Silent:
    """Stands in for a level's policy while the index alone is measured (the policy is measured apart)."""

    def on_insert(self, key: Hashable, info: AccessInfo) -> None: ...

    def on_access(self, key: Hashable, info: AccessInfo) -> None: ...

    def on_remove(self, key: Hashable) -> None: ...


def _store(root: Path, chunks: int) -> TieredStore:
    host = 4096 * (chunks // HOST_SHARE + 64)  # slots are page-aligned; the arena's pages are never touched
    config = StoreConfig(model_id="chunk-memory", layout=LAYOUT, tiers=(
        TierConfig(kind=TierKind.HOST, capacity_bytes=host, options={"prefault": False}),
        TierConfig(kind=TierKind.NVME, capacity_bytes=chunks * (LAYOUT.chunk_bytes + 8192), path=str(root / "nvme"))))
    return TieredStore(config)


def _meta() -> ChunkMeta:
    # a fresh object per chunk, as a put's encode makes one
    return ChunkMeta(codec_id=0, raw_bytes=LAYOUT.chunk_bytes, stored_bytes=LAYOUT.chunk_bytes,
                     layout_fingerprint=LAYOUT.fingerprint)


def _fill_disk(level: Level, keys: list[bytes]) -> None:
    record_chunk = level.tier._record  # type: ignore[attr-defined]  # the index a chunk file's write updates
    for key in keys:
        record_chunk(key, _meta())


def _fill_host(level: Level, keys: list[bytes]) -> None:
    arena = level.tier.as_arena()
    assert arena is not None
    for key in keys:
        arena.commit(key, arena.reserve(LAYOUT.chunk_bytes), _meta())


def _fill_index(store: TieredStore, keys: list[bytes], host_keys: list[bytes]) -> None:
    host, disk = store.levels
    for i, key in enumerate(keys):
        store.index.add_location(disk, key, _meta(), AccessInfo(size_bytes=LAYOUT.chunk_bytes, position=i % CHAIN))
    for i, key in enumerate(host_keys):
        store.index.add_location(host, key, _meta(), AccessInfo(size_bytes=LAYOUT.chunk_bytes, position=i % CHAIN))


def _policy_bytes(name: str, capacity: int) -> float:
    """The policy's bytes per held chunk at steady state: 3 capacities of new chunks inserted, the tier
    evicting as the store does (a victim per insert once full), the ghost lists full. Keys the policy
    alone still holds (its ghosts) count; the held keys are counted under `keys`."""
    holder: list[EvictionPolicy] = []

    def fill() -> None:
        policy = make_policy(name, capacity=capacity).eviction
        held = 0
        for i in range(3 * capacity):
            policy.on_insert(os.urandom(16), AccessInfo(size_bytes=LAYOUT.chunk_bytes, position=i % CHAIN))
            held += 1
            if held > capacity:
                for victim in policy.victims(1):
                    policy.on_remove(victim)
                    held -= 1
        holder.append(policy)

    total = _traced(fill)
    held_keys = len(holder[0])  # type: ignore[arg-type]  # every registered policy counts its keys
    return (total - held_keys * sys.getsizeof(os.urandom(16))) / capacity


def _turn_over(store: TieredStore, tenant: Tenant, keys: list[bytes], start: int) -> None:
    """Evict each of `keys[start:]` (the chunks held on disk only) from the index, the disk tier and the
    ledger, and hold a new chunk in its place, as a full tier does all day: CPython rebuilds a dict that keys
    come and go through with room for three times its keys, so these tables end larger than after one fill.
    The new keys replace the old in `keys`."""
    disk = store.levels[1]
    record_chunk = disk.tier._record  # type: ignore[attr-defined]
    for i in range(start, len(keys)):
        old = keys[i]
        store.index.forget(disk, old)
        record_chunk(old, None)
        tenant.forget([old])
        key = keys[i] = os.urandom(16)
        store.index.add_location(disk, key, _meta(), AccessInfo(size_bytes=LAYOUT.chunk_bytes, position=i % CHAIN))
        record_chunk(key, _meta())
        tenant.settle([key], LAYOUT.chunk_bytes, lambda _: True)


def measure(chunks: int, root: Path) -> dict[str, float]:
    """Bytes per chunk by component (tracemalloc), and the RSS of the whole fill without tracemalloc (first:
    memory the measured structures free once measured would be reused by a later fill, hiding from the RSS)."""
    rss = _rss_fill(root / "rss", chunks)
    store = _store(root, chunks)
    try:
        host, disk = store.levels
        for level in store.levels:
            level.eviction = _Silent()  # type: ignore[assignment]
        tracemalloc.start()
        keys: list[bytes] = []
        parts = {"keys": _traced(lambda: keys.extend(os.urandom(16) for _ in range(chunks))) / chunks}
        host_keys = keys[: chunks // HOST_SHARE]
        parts["index"] = _traced(lambda: _fill_index(store, keys, host_keys)) / chunks
        parts["disk tier"] = _traced(lambda: _fill_disk(disk, keys)) / chunks
        parts["host tier (per host chunk)"] = _traced(lambda: _fill_host(host, host_keys)) / len(host_keys)
        tenant = Tenant("a", root_key=bytes(16), salt="a", shm=True, quota_limit_bytes=None)
        parts["tenant ledger"] = _traced(lambda: tenant.settle(keys, LAYOUT.chunk_bytes, lambda _: True)) / chunks
        parts[TURNOVER] = _traced(lambda: _turn_over(store, tenant, keys, len(host_keys))) / chunks
        parts["disk policy: " + disk.config.eviction] = _policy_bytes(disk.config.eviction, chunks)
        parts["host policy: " + host.config.eviction + " (per host chunk)"] = _policy_bytes(
            host.config.eviction, len(host_keys))
        tracemalloc.stop()
    finally:
        store.close()
    parts["RSS, keys + index + tiers + ledger (no tracemalloc)"] = rss
    return parts


def _rss_fill(root: Path, chunks: int) -> float:
    """RSS bytes per chunk of keys + index + tiers + ledger, policies silenced as above."""
    store = _store(root, chunks)
    try:
        for level in store.levels:
            level.eviction = _Silent()  # type: ignore[assignment]
        gc.collect()
        before = _rss_bytes()
        keys = [os.urandom(16) for _ in range(chunks)]
        host_keys = keys[: chunks // HOST_SHARE]
        _fill_index(store, keys, host_keys)
        _fill_disk(store.levels[1], keys)
        _fill_host(store.levels[0], host_keys)
        Tenant("a", root_key=bytes(16), salt="a", shm=True, quota_limit_bytes=None).settle(
            keys, LAYOUT.chunk_bytes, lambda _: True)
        gc.collect()
        return (_rss_bytes() - before - 8 * chunks) / chunks  # less the bench's own list of keys
    finally:
        store.close()


def _records(parts: dict[str, float]) -> list[Record]:
    disk_policy = next(v for k, v in parts.items() if k.startswith("disk policy"))
    host_policy = next(v for k, v in parts.items() if k.startswith("host policy"))
    disk_only = parts["keys"] + parts["index"] + parts["disk tier"] + parts["tenant ledger"] + disk_policy
    both = disk_only + parts["host tier (per host chunk)"] + host_policy
    limit = f"limit ({LIMIT_BYTES} B)"
    out = [record("bytes per chunk held on disk only (all components)", disk_only, "B", limit, LIMIT_BYTES),
           record("  the same after every disk-only chunk was evicted and replaced once", disk_only + parts[TURNOVER],
                  "B", limit, LIMIT_BYTES),
           record("  the same without its eviction policy's state", disk_only - disk_policy, "B", limit, LIMIT_BYTES),
           record("bytes per chunk held on host only (all components)", disk_only - parts["disk tier"] - disk_policy
                  + parts["host tier (per host chunk)"] + host_policy, "B", limit, LIMIT_BYTES),
           record("bytes per chunk held on host and disk (all components)", both, "B", limit, LIMIT_BYTES),
           record(f"bytes per chunk held, averaged over this mix (1 in {HOST_SHARE} on host too)",
                  disk_only + parts[TURNOVER] + (both - disk_only) / HOST_SHARE, "B", limit, LIMIT_BYTES)]
    out += [record(f"  {name}", value, "B", limit, LIMIT_BYTES) for name, value in parts.items()]
    return out


def run(quick: bool = False, chunks: int | None = None) -> list[Record]:
    """`kvstore bench chunk_memory`: a million chunks (100,000 with --quick)."""
    chunks = chunks or (100_000 if quick else 1_000_000)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvstore-chunk-memory-") as tmp:
        parts = measure(chunks, Path(tmp))
    records = _records(parts)
    print_records(f"chunk memory: {chunks:,} chunks held ({chunks // HOST_SHARE:,} in the host tier too), "
                  f"{time.monotonic() - started:.0f} s", records)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    records = run(chunks=args.chunks)
    if args.json:
        from bench.common import machine_info

        args.json.write_text(json.dumps({"suite": "chunk_memory", "machine": machine_info(), "chunks": args.chunks,
                                         "records": records}, indent=1))


if __name__ == "__main__":
    main()
