"""What each held chunk costs the process in memory, by component: the one model the daemon's reports and the planner use.

    chunk held ──> key (one bytes object, shared by every table)      KEY_BYTES
                   ChunkIndex entry and its slot in the index map      INDEX_ENTRY_BYTES
                   per tier holding it: the tier's record              DISK_RECORD_BYTES / MEMORY_RECORD_BYTES
                                        its eviction policy's state    POLICY_BYTES[name] (steady state, ghosts full)
                   per tenant ledger charging it (service/)            LEDGER_ENTRY_BYTES

The figures are what `bench/chunk_memory.py` measures with tracemalloc over a million chunks (CPython
3.11, 64-bit), rounded up to the allocator's 16-byte size classes; run it after changing any of
these structures. Counting is O(tiers): chunks per tier times a constant, never a walk of the tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstore.key_table import key_map_is_compact
from kvstore.types import TierKind

if TYPE_CHECKING:
    from kvstore.store.levels import Level

KEY_BYTES = 64  # a 16-byte key: a 49-byte bytes object in a 64-byte allocator block
# a key's slot in a KeyIndex (kvstore/csrc/key_index.c, 33-38 B at any turnover), or in its twin, a dict, where
# there is no C build (42 B after one fill, 60-120 under turnover: CPython rebuilds it with room for 3x its keys)
KEY_MAP_SLOT_BYTES = 48 if key_map_is_compact() else 96
INDEX_ENTRY_BYTES = 64 + KEY_MAP_SLOT_BYTES  # Entry (four slots, 64 B; metadata shared) and its slot in the index
DISK_RECORD_BYTES = 48  # a disk tier's KeyTable slot (its metadata object is shared: kvstore.types.shared_meta)
# a memory tier's slot: one int-valued map slot (offset and metadata id packed, tiers/arena.py); the dict twin adds
# an int object per slot
MEMORY_RECORD_BYTES = KEY_MAP_SLOT_BYTES if key_map_is_compact() else KEY_MAP_SLOT_BYTES + 32
LEDGER_ENTRY_BYTES = 48  # a tenant ledger's KeyTable slot (service/byte_ledger.py)
# An eviction policy's bytes per held chunk at steady state (a full tier evicting, ghost lists full),
# per registered name; an unknown name counts as the costliest.
POLICY_BYTES = {"lru": 144, "lfu": 480, "arc": 128, "s3fifo": 368, "adaptive": 240}


def policy_bytes(eviction: str) -> int:
    """Bytes per held chunk of the eviction policy named `eviction` (`name` or `name+admission`)."""
    return POLICY_BYTES.get(eviction.partition("+")[0], max(POLICY_BYTES.values()))


def tier_chunk_bytes(*, is_memory: bool, eviction: str) -> int:
    """Bytes per chunk a tier holds: its record and its policy's state (the key and index entry aside)."""
    return (MEMORY_RECORD_BYTES if is_memory else DISK_RECORD_BYTES) + policy_bytes(eviction)


def planned_bytes(held: Sequence[tuple[bool, str, int]]) -> int:
    """Process memory for holding chunks in tiers given as (is_memory, eviction policy, chunks held); the
    index counts each chunk once, at the largest count (an inclusive hierarchy keeps a lower copy of each)."""
    indexed = max((n for _, _, n in held), default=0)
    return indexed * (KEY_BYTES + INDEX_ENTRY_BYTES) + sum(
        n * tier_chunk_bytes(is_memory=memory, eviction=eviction) for memory, eviction, n in held)


def store_memory(levels: Sequence[Level], num_indexed: int) -> dict[str, int]:
    """A store's memory by component: its host tier's arena, and its per-chunk state (`num_indexed` index
    entries, every tier's records and policy state) as the model above counts it."""
    host = sum(level.tier.capacity_bytes for level in levels if level.kind is TierKind.HOST)
    state = num_indexed * (KEY_BYTES + INDEX_ENTRY_BYTES) + sum(
        len(level.eviction) * tier_chunk_bytes(is_memory=level.tier.is_memory, eviction=level.config.eviction)
        for level in levels)
    return {"host_tier_bytes": host, "index_and_chunk_state_bytes": state}
