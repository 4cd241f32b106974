"""`ByteLedger`: the store keys one owner (a tenant, a model) holds, their bytes, and its quota.

    charge(keys, bytes)  before a put: new keys charged now (so concurrent puts cannot overrun the quota);
                         returns the owner's own least recently used keys to remove for room
    settle(keys, ...)    after a put, an eviction or a removal: held keys charged and most recent, the rest
                         forgotten

Not a store: only keys and byte counts, one entry per chunk the owner holds. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from kvstore.hashing import ChunkKey
from kvstore.key_table import KeyTable
from service.errors import QuotaError

logger = logging.getLogger(__name__)


class ByteLedger:
    """One owner's keys (LRU first) and bytes; `label` names it in messages ("tenant 'a'", "model 'x'")."""

    def __init__(self, label: str, quota_limit_bytes: int | None) -> None:
        self.label = label
        self.quota_limit_bytes = quota_limit_bytes
        # store key -> bytes, least recently used first: one entry per chunk the owner holds, millions of them,
        # so a KeyTable (about 35 bytes a key; a dict that keys come and go through keeps 60-120)
        self._ledger: KeyTable[int] = KeyTable(ordered=True, int_values=True)
        self._used_bytes = 0
        self._unconfirmed: set[ChunkKey] = set()  # charged, not yet seen in the store (settle reports them once)
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    @property
    def num_chunks(self) -> int:
        return len(self._ledger)

    def keys(self) -> list[ChunkKey]:
        with self._lock:
            return self._ledger.keys()  # type: ignore[return-value]  # only ChunkKeys go in

    def owns(self, store_key: ChunkKey) -> bool:
        with self._lock:
            return store_key in self._ledger

    def charge(self, store_keys: list[ChunkKey], chunk_bytes: int) -> list[ChunkKey]:
        """Charge new chunks before they are stored (so concurrent puts cannot overrun the quota);
        returns the tenant's own least recently used keys to remove to make quota room.

        Raises:
            QuotaError: the request does not fit the tenant's quota.
        """
        with self._lock:
            new = list(dict.fromkeys(k for k in store_keys if k not in self._ledger))
            need = len(new) * chunk_bytes
            victims = self._victims(set(store_keys), need)
            for key in victims:
                self._used_bytes -= self._ledger.pop(key, 0)  # type: ignore[operator]  # int values
                self._unconfirmed.discard(key)
            for key in new:
                self._ledger.put(key, chunk_bytes)
            self._unconfirmed.update(new)
            self._used_bytes += need
        if victims:
            logger.info("%s: quota of %s bytes reached; dropping %d of its own chunks",
                        self.label, self.quota_limit_bytes, len(victims))
        return victims

    def _victims(self, protected: set[ChunkKey], need: int) -> list[ChunkKey]:
        limit = self.quota_limit_bytes
        if limit is None or self._used_bytes + need <= limit:
            return []
        victims: list[ChunkKey] = []
        freed = 0
        for key, nbytes in self._ledger.items():
            if self._used_bytes - freed + need <= limit:
                break
            if key not in protected:
                victims.append(key)  # type: ignore[arg-type]  # only ChunkKeys go in
                freed += nbytes
        if self._used_bytes - freed + need > limit:
            raise QuotaError(f"{self.label}: {need} more bytes do not fit the quota of {limit} bytes; "
                             "send fewer chunks per request, or raise the quota")
        return victims

    def settle(self, store_keys: Iterable[ChunkKey], chunk_bytes: int, holds: Callable[[ChunkKey], bool]) -> list[ChunkKey]:
        """Make the ledger say what the store holds for these keys (after a put or an eviction): held
        keys are charged and most recent, the others forgotten. Returns the held keys
        seen for the first time (newly charged, or charged before the store held them)."""
        added: list[ChunkKey] = []
        with self._lock:
            for key in store_keys:
                if holds(key):
                    if self._ledger.move_to_end(key):
                        if key in self._unconfirmed:
                            added.append(key)
                    else:
                        self._ledger.put(key, chunk_bytes)
                        self._used_bytes += chunk_bytes
                        added.append(key)
                    self._unconfirmed.discard(key)
                else:
                    self._used_bytes -= self._ledger.pop(key, 0)  # type: ignore[operator]  # int values
                    self._unconfirmed.discard(key)
        return added

    def touch(self, store_keys: Iterable[ChunkKey]) -> None:
        with self._lock:
            for key in store_keys:
                self._ledger.move_to_end(key)

    def forget(self, store_keys: Iterable[ChunkKey]) -> None:
        with self._lock:
            for key in store_keys:
                self._used_bytes -= self._ledger.pop(key, 0)  # type: ignore[operator]  # int values
                self._unconfirmed.discard(key)
