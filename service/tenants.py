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
from collections.abc import Iterable
from dataclasses import dataclass

import xxhash

from kvstore.hashing import ChunkKey, Namespace
from service.byte_ledger import ByteLedger
from service.config import DEFAULT_TENANT, TenantConfig
from service.model_metrics import ModelCounters

logger = logging.getLogger(__name__)


class Tenant(ByteLedger):
    """One tenant at run time: namespace root, key map, shm right and quota ledger (ByteLedger)."""

    def __init__(self, name: str, *, root_key: ChunkKey, salt: str | None, shm: bool,
                 quota_limit_bytes: int | None) -> None:
        super().__init__(f"tenant {name!r}", quota_limit_bytes)
        self.name = name
        self.root_key = root_key
        self.shm = shm
        self._prefix = None if salt is None else b"kvstore-tenant/1\0" + salt.encode() + b"\0"
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
