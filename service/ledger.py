"""`Ledger`: tenants' byte ledgers that follow the store's index, and survive a restart.

    put/reserve ──charge──> tenant ledger (quota checked, before any byte is stored)
    put/commit/abort done ──settle──> held keys stay charged, the rest are forgotten
    store drops a key (eviction, demotion out of the last tier, corrupt, removed) ──> forgotten
    restart ──rebuild──> resident keys charged to the tenant recorded for them (owner log)

The owner log (`tenant-owners.log` in the first disk tier's directory) records which tenant stored
each key, one fixed-size record per new chunk; at startup it is read, matched against the keys
the store rebuilt from its chunk headers, and rewritten with only those. Chunk files themselves
are unchanged, so files written before the log existed stay readable (charged to nobody).
Memory: one ledger entry per indexed chunk at most, since the ledger follows the index.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from kvstore.hashing import ChunkKey
from kvstore.store import TieredStore
from kvstore.types import TierKind
from service.tenants import Tenant

logger = logging.getLogger(__name__)

OWNER_LOG = "tenant-owners.log"
_NAME_BYTES = 48  # a record: 16-byte key + tenant name, NUL padded


class OwnerLog:
    """Append-only (key, tenant name) records; the last record of a key wins."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()  # the file is opened per append: no write handle stays open on the tier
        self.records = 0

    def read(self) -> dict[ChunkKey, str]:
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        size = 16 + _NAME_BYTES
        owners: dict[ChunkKey, str] = {}
        for off in range(0, len(data) - size + 1, size):  # a torn last record is ignored
            owners[data[off:off + 16]] = data[off + 16:off + size].rstrip(b"\0").decode(errors="replace")
        return owners

    def append(self, records: Iterable[tuple[ChunkKey, str]]) -> None:
        blob = b"".join(key + name.encode()[:_NAME_BYTES].ljust(_NAME_BYTES, b"\0") for key, name in records)
        if not blob:
            return
        with self._lock:
            try:
                with self.path.open("ab") as log:
                    log.write(blob)
            except OSError as exc:  # the chunk is stored all the same; only its owner is not recorded
                logger.warning("owner log %s not written (%s): these chunks count for no tenant after a restart",
                               self.path, exc)
                return
            self.records += len(blob) // (16 + _NAME_BYTES)

    def rewrite(self, records: dict[ChunkKey, str]) -> None:
        """Replace the log with `records` (atomically: temp file, fsync, rename)."""
        temp = self.path.with_suffix(".tmp")
        with self._lock:
            try:
                with temp.open("wb") as out:
                    out.write(b"".join(k + n.encode()[:_NAME_BYTES].ljust(_NAME_BYTES, b"\0")
                                       for k, n in records.items()))
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temp, self.path)
            except OSError as exc:
                logger.warning("owner log %s not rewritten (%s); the old one stays", self.path, exc)
                return
            self.records = len(records)


class Ledger:
    """Every tenant's ledger kept equal to what the store's index holds for it."""

    def __init__(self, store: TieredStore, tenants: list[Tenant]) -> None:
        self.store = store
        self.tenants = tenants
        self._by_name = {t.name: t for t in tenants}
        disk = next((lv for lv in store.levels if lv.kind is TierKind.NVME and lv.config.path), None)
        self.log = None if disk is None else OwnerLog(Path(str(disk.config.path)) / OWNER_LOG)
        store.add_drop_listener(self.on_dropped)

    def charge(self, tenant: Tenant, store_keys: list[ChunkKey], chunk_bytes: int) -> list[ChunkKey]:
        """Charge `chunk_bytes` per new chunk before storing; returns the tenant's own chunks to remove for
        quota room."""
        return tenant.charge(store_keys, chunk_bytes)

    def settle(self, tenant: Tenant, store_keys: Iterable[ChunkKey], chunk_bytes: int) -> None:
        """After a put (its chunks of `chunk_bytes` each) or a removal: the ledger follows the index."""
        added = tenant.settle(store_keys, chunk_bytes, self.store.holds)
        if self.log is not None and added:
            self.log.append((k, tenant.name) for k in added)
            self._compact_if_long()

    def on_dropped(self, key: ChunkKey) -> None:
        for tenant in self.tenants:
            if tenant.owns(key):
                tenant.settle([key], self.store.raw_bytes_of(key) or 0, self.store.holds)

    def rebuild(self) -> int:
        """Charge every resident chunk to the tenant the owner log names; rewrite the log. Returns the count."""
        if self.log is None:
            return 0
        owners = self.log.read()
        kept: dict[ChunkKey, str] = {}
        for key, _ in self.store.resident_keys():
            tenant = self._by_name.get(owners.get(key, ""))
            if tenant is not None:
                tenant.settle([key], self.store.raw_bytes_of(key) or 0, self.store.holds)
                kept[key] = tenant.name
        self.log.rewrite(kept)
        logger.info("tenant ledgers rebuilt: %d of %d resident chunks have a known owner",
                    len(kept), len(self.store.resident_keys()))
        return len(kept)

    def _compact_if_long(self) -> None:
        assert self.log is not None
        held = sum(t.num_chunks for t in self.tenants)
        if self.log.records > 4 * held + 100_000:
            self.log.rewrite(self.snapshot())

    def snapshot(self) -> dict[ChunkKey, str]:
        return {k: t.name for t in self.tenants for k in t.keys()}

    def close(self) -> None:
        """Nothing stays open; kept so the daemon's shutdown reads as a pairing."""
