"""Tenants: a salted key namespace each, server-side key mapping, and a byte quota ledger.

    client key (16 B, from the tenant's salted namespace)
        --map_key: xxh3_128("kvstore-tenant/1" | salt | client key)-->  store key

A tenant only ever names client keys; the daemon maps them before touching the store, so a key
that another tenant holds maps elsewhere: no request of tenant B can read, probe or delete a
chunk of tenant A, even with A's keys in hand. The anonymous tenant (no auth configured) uses
the store's own namespace and the identity map, so an embedded store and the daemon agree.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable

import xxhash

from kvstore.hashing import ChunkKey, Namespace
from service.config import DEFAULT_TENANT, TenantConfig
from service.errors import QuotaError

logger = logging.getLogger(__name__)


class Tenant:
    """One tenant at run time: namespace root, key map, shm right and quota ledger."""

    def __init__(self, name: str, *, root_key: ChunkKey, salt: str | None, shm: bool,
                 quota_limit_bytes: int | None) -> None:
        self.name = name
        self.root_key = root_key
        self.shm = shm
        self.quota_limit_bytes = quota_limit_bytes
        self._prefix = None if salt is None else b"kvstore-tenant/1\0" + salt.encode() + b"\0"
        self._ledger: OrderedDict[ChunkKey, int] = OrderedDict()  # store key -> bytes, LRU first
        self._used_bytes = 0
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: TenantConfig, namespace: Namespace) -> Tenant:
        return cls(config.name, root_key=namespace.for_tenant(config.salt).root_key, salt=config.salt,
                   shm=config.shm, quota_limit_bytes=config.quota_limit_bytes)

    @classmethod
    def anonymous(cls, root_key: ChunkKey) -> Tenant:
        return cls(DEFAULT_TENANT, root_key=root_key, salt=None, shm=True, quota_limit_bytes=None)

    def map_key(self, key: ChunkKey) -> ChunkKey:
        return key if self._prefix is None else xxhash.xxh3_128_digest(self._prefix + key)

    def map_keys(self, keys: Iterable[ChunkKey]) -> list[ChunkKey]:
        return [self.map_key(k) for k in keys]

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    def admit(self, store_keys: list[ChunkKey], chunk_bytes: int) -> list[ChunkKey]:
        """Make quota room for new chunks; returns the tenant's own least recently used keys to remove.

        Raises:
            QuotaError: the request alone is larger than the tenant's quota.
        """
        if self.quota_limit_bytes is None:
            return []
        with self._lock:
            new = {k for k in store_keys if k not in self._ledger}
            need = len(new) * chunk_bytes
            if need > self.quota_limit_bytes:
                raise QuotaError(f"tenant {self.name!r}: {len(new)} new chunks need {need} bytes but the quota is "
                                 f"{self.quota_limit_bytes} bytes; send fewer chunks per request or raise the quota")
            victims: list[ChunkKey] = []
            protected = set(store_keys)
            for key in list(self._ledger):
                if self._used_bytes + need <= self.quota_limit_bytes:
                    break
                if key in protected:
                    continue
                self._used_bytes -= self._ledger.pop(key)
                victims.append(key)
        if victims:
            logger.info("tenant %s: quota of %d bytes reached; dropping %d of its own chunks",
                        self.name, self.quota_limit_bytes, len(victims))
        return victims

    def record(self, store_keys: Iterable[ChunkKey], chunk_bytes: int) -> None:
        """Account stored chunks (already present ones just become most recent)."""
        with self._lock:
            for key in store_keys:
                if key not in self._ledger:
                    self._used_bytes += chunk_bytes
                    self._ledger[key] = chunk_bytes
                self._ledger.move_to_end(key)

    def touch(self, store_keys: Iterable[ChunkKey]) -> None:
        with self._lock:
            for key in store_keys:
                if key in self._ledger:
                    self._ledger.move_to_end(key)

    def forget(self, store_keys: Iterable[ChunkKey]) -> None:
        with self._lock:
            for key in store_keys:
                self._used_bytes -= self._ledger.pop(key, 0)


class TenantDirectory:
    """Token -> tenant. With no tenants configured, every request is the anonymous tenant."""

    def __init__(self, configs: tuple[TenantConfig, ...], namespace: Namespace) -> None:
        self.auth_enabled = bool(configs)
        self._by_token = {c.token: Tenant.from_config(c, namespace) for c in configs}
        self.anonymous = None if configs else Tenant.anonymous(namespace.root_key)

    def by_token(self, token: str) -> Tenant | None:
        import hmac

        found = None
        for known, tenant in self._by_token.items():  # compare all, in constant time each
            if hmac.compare_digest(known.encode(), token.encode()):
                found = tenant
        return found

    def all(self) -> list[Tenant]:
        return list(self._by_token.values()) if self.auth_enabled else [self.anonymous]  # type: ignore[list-item]
