"""`RedisLedger`: what this process knows it holds in Redis: chunk metas, committed and reserved bytes.

Redis itself is shared by every node, so this is one node's view (see tiers/redis_tier.py on
`used_bytes`): puts reserve before they send and record once Redis has the value; reads and
`keys()` record what they find. Thread-safe.
"""

from __future__ import annotations

import threading

from kvstore.chunk_format import HEADER_BYTES
from kvstore.errors import TierFullError
from kvstore.types import ChunkMeta, shared_meta


def footprint(stored_bytes: int) -> int:
    """Bytes a chunk value takes in Redis: header + payload (no padding)."""
    return HEADER_BYTES + stored_bytes


class RedisLedger:
    """Chunk metas and byte counts against `capacity_bytes`."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._index: dict[bytes, ChunkMeta] = {}
        self._committed_bytes = 0
        self._reserved_bytes = 0

    @property
    def used_bytes(self) -> int:
        return self._committed_bytes + self._reserved_bytes

    def reserve(self, key: bytes, nbytes: int) -> None:
        """Hold `nbytes` for a value of `key` about to be sent (its old value's bytes count as freed)."""
        with self._lock:
            old = self._index.get(key)
            freed = footprint(old.stored_bytes) if old is not None else 0
            used = self._committed_bytes + self._reserved_bytes
            if used - freed + nbytes > self.capacity_bytes:
                raise TierFullError(f"RedisTier: a {nbytes}-byte chunk does not fit (used {used} of "
                                    f"{self.capacity_bytes} bytes); evict first")
            self._reserved_bytes += nbytes

    def unreserve(self, nbytes: int) -> None:
        with self._lock:
            self._reserved_bytes -= nbytes

    def record(self, key: bytes, meta: ChunkMeta | None) -> None:
        """`key` now holds `meta` in Redis (None: it holds nothing)."""
        with self._lock:
            old = self._index.pop(key, None)
            if old is not None:
                self._committed_bytes -= footprint(old.stored_bytes)
            if meta is not None:
                self._index[key] = shared_meta(meta)
                self._committed_bytes += footprint(meta.stored_bytes)

    def record_if_changed(self, key: bytes, meta: ChunkMeta) -> None:
        """A read found `meta`: record it when seen for the first time, or rewritten by another node."""
        if self._index.get(key) != meta:
            self.record(key, meta)

    def replace_all(self, found: dict[bytes, ChunkMeta]) -> list[tuple[bytes, ChunkMeta]]:
        """Forget everything but `found` (a full listing of Redis); returns its items."""
        with self._lock:
            self._index = {key: shared_meta(meta) for key, meta in found.items()}
            self._committed_bytes = sum(footprint(meta.stored_bytes) for meta in found.values())
            return list(found.items())

    def __len__(self) -> int:
        return len(self._index)
