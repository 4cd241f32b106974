"""`ArenaGrants`: the Backend's part for `shm_plane = "arena"` (service/routes_shm.py): slots of the
host arena reserved, committed, aborted, leased and released under grant ids with deadlines.

The arena is mapped whole by every client with the shm right: one trust domain only (see
README "Security"). Quotas are charged at reservation and held until commit or abort; read
leases are capped per tenant and overall; a batch with bogus ids still processes the valid ones.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from kvstore.hashing import ChunkKey
from kvstore.store import TieredStore
from kvstore.types import PutResult
from service.errors import ForbiddenError, NotFoundError
from service.leases import GrantKind, GrantTable
from service.ledger import Ledger
from service.pin_budget import PinBudget
from service.tenants import Tenant

logger = logging.getLogger(__name__)


class GrantOwner(Protocol):
    """What ArenaGrants needs from its owner (service/backend.py's Backend): the batch limit, the
    tenant's quota, and the end of a put (wait for disk copies, map keys back)."""

    def check_batch(self, num_chunks: int) -> None: ...

    def enforce_quota(self, tenant: Tenant, mapped: list[ChunkKey], *, hold: bool = False) -> None: ...

    def finish_put(self, tenant: Tenant, keys: Sequence[ChunkKey], mapped: list[ChunkKey],
                   result: PutResult, started: float) -> PutResult: ...


class ArenaGrants:
    """The arena plane's grants, held by the Backend (`backend.arena`).

    Args:
        owner: the Backend (see GrantOwner).
        store, ledger, pins, grants: the Backend's store, quota ledger, lease renewal budget and grant table.
        shm_name: the arena's shared-memory name; None when the daemon serves no arena (every call is refused).
        lease_limit: (bytes one tenant, bytes all tenants) may hold under read leases.
        lease_s: how long a grant lasts (for messages).
    """

    def __init__(self, owner: GrantOwner, *, store: TieredStore, ledger: Ledger, pins: PinBudget, grants: GrantTable,
                 shm_name: str | None, lease_limit: tuple[int, int], lease_s: float) -> None:
        self._owner = owner
        self._store, self._ledger, self._pins, self._grants = store, ledger, pins, grants
        self._shm_name, self._lease_limit, self._lease_s = shm_name, lease_limit, lease_s

    def _check_shm(self, tenant: Tenant) -> None:
        if not tenant.shm:
            raise ForbiddenError(f"tenant {tenant.name!r} may not use the shared-memory plane; set shm = true for it "
                                 "in [[service.tenants]] or use the HTTP chunk routes")
        if self._shm_name is None:
            raise ForbiddenError("this daemon's host tier is not in shared memory (service.shm_plane is not "
                                 "'arena'); use /v1/shm/segments or the HTTP chunk routes")

    def reserve(self, tenant: Tenant, keys: Sequence[ChunkKey]) -> list[tuple[str, int, int]]:
        """(grant id, offset, nbytes) per key; all or nothing."""
        self._check_shm(tenant)
        self._owner.check_batch(len(keys))
        mapped = tenant.map_keys(keys)
        self._owner.enforce_quota(tenant, mapped, hold=True)
        grants: list[tuple[str, int, int]] = []
        try:
            for key, mapped_key in zip(keys, mapped, strict=True):
                res = self._store.reserve(mapped_key)
                try:
                    grant_id = self._grants.add(GrantKind.RESERVATION, tenant.name, (res, mapped_key, key), res.nbytes)
                except BaseException:
                    self._store.abort(res)
                    raise
                grants.append((grant_id, res.offset, res.nbytes))
        except BaseException:
            if grants:
                self.abort(tenant, [g[0] for g in grants])
            tenant.unhold(mapped)
            self._ledger.settle(tenant, mapped)
            raise
        return grants

    def commit(self, tenant: Tenant, grant_ids: Sequence[str]) -> tuple[PutResult, list[str]]:
        """Publish reserved slots the client has filled; answers with client keys, plus the ids that
        named no open reservation of this tenant (the valid ones are published all the same)."""
        self._owner.check_batch(len(grant_ids))
        handles, unknown = self._take_all(grant_ids, GrantKind.RESERVATION, tenant)
        result = PutResult()
        started = time.monotonic()
        try:
            for i, (reservation, _, _) in enumerate(handles):
                try:
                    part = self._store.commit(reservation)
                except BaseException:
                    for later, _, _ in handles[i + 1:]:  # never leak the slots not yet published
                        self._store.abort(later)
                    raise
                result.stored += part.stored
                result.not_stored.update(part.not_stored)
                result.not_replicated.update(part.not_replicated)
        finally:
            tenant.unhold(h[1] for h in handles)
            self._ledger.settle(tenant, [h[1] for h in handles])
        return self._owner.finish_put(tenant, [h[2] for h in handles], [h[1] for h in handles], result, started), unknown

    def _take_all(self, grant_ids: Sequence[str], kind: GrantKind, tenant: Tenant) -> tuple[list[Any], list[str]]:
        """The handles of the ids open for this tenant, and the ids that are not (NotFoundError when none is)."""
        handles, unknown = [], []
        for gid in dict.fromkeys(grant_ids):
            handle = self._grants.try_take(gid, kind, tenant.name)
            if handle is None:
                unknown.append(gid)
            else:
                handles.append(handle)
        if unknown and not handles:
            raise NotFoundError(f"no open {kind.value} among the {len(unknown)} ids for this tenant; they were "
                                f"already released or expired (leases last {self._lease_s:g} s)")
        return handles, unknown

    def abort(self, tenant: Tenant, grant_ids: Sequence[str]) -> list[str]:
        handles, unknown = self._take_all(grant_ids, GrantKind.RESERVATION, tenant)
        for reservation, _, _ in handles:
            self._store.abort(reservation)
        tenant.unhold(h[1] for h in handles)
        self._ledger.settle(tenant, [h[1] for h in handles])
        return unknown

    def acquire(self, tenant: Tenant, keys: Sequence[ChunkKey]) -> list[tuple[str, int, int] | None]:
        """(grant id, offset, nbytes) per key, None on a miss; on an error no lease stays open."""
        self._check_shm(tenant)
        self._owner.check_batch(len(keys))
        mapped = tenant.map_keys(keys)
        self._pins.check(tenant.name, mapped)  # renewals bounded: no chunk pinned for good
        leases: list[tuple[str, int, int] | None] = []
        try:
            for key in mapped:
                lease = self._store.acquire(key)
                if lease is None:
                    leases.append(None)
                    continue
                try:
                    grant_id = self._grants.add(GrantKind.LEASE, tenant.name, lease, lease.nbytes, limit=self._lease_limit)
                except BaseException:
                    self._store.release(lease)
                    raise
                leases.append((grant_id, lease.offset, lease.nbytes))
        except BaseException:
            self.release(tenant, [g[0] for g in leases if g is not None])
            raise
        return leases

    def release(self, tenant: Tenant, grant_ids: Sequence[str]) -> list[str]:
        """End the leases open for this tenant; returns the ids that were not."""
        self._owner.check_batch(len(grant_ids))
        handles, unknown = self._take_all(grant_ids, GrantKind.LEASE, tenant)
        for lease in handles:
            self._store.release(lease)
        return unknown

    def reap(self, grants: Sequence[Any] | None = None) -> int:
        """Release leases and abort reservations whose clients let them expire (or all, at shutdown)."""
        grants = self._grants.expired() if grants is None else grants
        for grant in grants:
            if grant.kind is GrantKind.LEASE:
                self._store.release(grant.handle)
            else:
                self._store.abort(grant.handle[0])
                self._settle_by_name(grant.tenant, [grant.handle[1]])
        return len(grants)

    def _settle_by_name(self, name: str, mapped: list[ChunkKey]) -> None:
        tenant = next((t for t in self._ledger.tenants if t.name == name), None)
        if tenant is not None:
            tenant.unhold(mapped)
            self._ledger.settle(tenant, mapped)
