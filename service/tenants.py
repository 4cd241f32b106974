"""Tenants: a salted key namespace each, server-side key mapping, and a byte quota ledger.

    client key (16 B, from the tenant's salted namespace)
        --map_key: xxh3_128("kvstore-tenant/1" | salt | client key)-->  store key

A tenant only ever names client keys; the daemon maps them before touching the store, so a key
that another tenant holds maps elsewhere: no request of tenant B can read, probe or delete a
chunk of tenant A, even with A's keys in hand. The anonymous tenant (no auth configured) uses
the store's own namespace and the identity map, so an embedded store and the daemon agree.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import xxhash

from kvstore.hashing import ChunkKey, Namespace
from service.config import DEFAULT_TENANT, TenantConfig
from service.errors import QuotaError
from service.model_metrics import ModelCounters

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
        # store key -> bytes, least recently used first: a plain dict (insertion order; a touch re-inserts),
        # a third of an OrderedDict's bytes per chunk, and the daemon holds one entry per chunk it stores
        self._ledger: dict[ChunkKey, int] = {}
        self._used_bytes = 0
        self._unconfirmed: set[ChunkKey] = set()  # charged, not yet seen in the store (settle reports them once)
        self._lock = threading.Lock()
        self.fast_lookups = 0  # lookups of this tenant answered by service/fast_lookup.py
        self.models = ModelCounters()  # its lookups and gets by model and tier (/metrics); its own, never shared

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

    @property
    def num_chunks(self) -> int:
        return len(self._ledger)

    def keys(self) -> list[ChunkKey]:
        with self._lock:
            return list(self._ledger)

    def owns(self, store_key: ChunkKey) -> bool:
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
                self._used_bytes -= self._ledger.pop(key)
                self._unconfirmed.discard(key)
            for key in new:
                self._ledger[key] = chunk_bytes
            self._unconfirmed.update(new)
            self._used_bytes += need
        if victims:
            logger.info("tenant %s: quota of %s bytes reached; dropping %d of its own chunks",
                        self.name, self.quota_limit_bytes, len(victims))
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
                victims.append(key)
                freed += nbytes
        if self._used_bytes - freed + need > limit:
            raise QuotaError(f"tenant {self.name!r}: {need} more bytes do not fit the quota of {limit} bytes; "
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
                    if key not in self._ledger:  # inserted last: already the most recent
                        self._ledger[key] = chunk_bytes
                        self._used_bytes += chunk_bytes
                        added.append(key)
                    else:
                        if key in self._unconfirmed:
                            added.append(key)
                        self._ledger[key] = self._ledger.pop(key)
                    self._unconfirmed.discard(key)
                else:
                    self._used_bytes -= self._ledger.pop(key, 0)
                    self._unconfirmed.discard(key)
        return added

    def touch(self, store_keys: Iterable[ChunkKey]) -> None:
        with self._lock:
            for key in store_keys:
                if key in self._ledger:
                    self._ledger[key] = self._ledger.pop(key)

    def forget(self, store_keys: Iterable[ChunkKey]) -> None:
        with self._lock:
            for key in store_keys:
                self._used_bytes -= self._ledger.pop(key, 0)
                self._unconfirmed.discard(key)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: a tenant, the admin, or the metrics scraper (tenant None for the last two)."""

    tenant: Tenant | None
    admin: bool = False
    metrics: bool = False


class TenantDirectory:
    """Token -> tenant (or the admin / metrics role). With no tenants configured, every request is
    the anonymous tenant."""

    def __init__(self, configs: tuple[TenantConfig, ...], namespace: Namespace, *,
                 admin_token: str | None = None, metrics_token: str | None = None) -> None:
        self.auth_enabled = bool(configs)
        self._by_token = {c.token: Tenant.from_config(c, namespace) for c in configs}
        self.anonymous = None if configs else Tenant.anonymous(namespace.root_key)
        self._admin_token = admin_token
        self._metrics_token = metrics_token

    def by_token(self, token: str) -> Tenant | None:
        found = None
        for known, tenant in self._by_token.items():  # compare all, in constant time each
            if hmac.compare_digest(known.encode(), token.encode()):
                found = tenant
        return found

    def tenant_of_token(self, token: str) -> Tenant | None:
        """The tenant a bare token names (the anonymous one without auth)."""
        return self.anonymous if not self.auth_enabled else self.by_token(token)

    def caller_of(self, token: str) -> Caller | None:
        """The tenant or role `token` names, None when it names nothing (compared in constant time)."""
        tenant = self.by_token(token)
        if tenant is not None:
            return Caller(tenant)
        if self._admin_token is not None and hmac.compare_digest(self._admin_token.encode(), token.encode()):
            return Caller(None, admin=True, metrics=True)
        if self._metrics_token is not None and hmac.compare_digest(self._metrics_token.encode(), token.encode()):
            return Caller(None, metrics=True)
        return None

    def metrics_open(self) -> bool:
        """/metrics needs no token: no auth and no metrics token configured (loopback trust)."""
        return not self.auth_enabled and self._metrics_token is None

    def all(self) -> list[Tenant]:
        return list(self._by_token.values()) if self.auth_enabled else [self.anonymous]  # type: ignore[list-item]
