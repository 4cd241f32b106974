"""Deadlines for shared-memory leases and reservations, so a client that dies never leaks a slot.

Each grant gets an unguessable id, its tenant and a deadline `lease_s` ahead. The daemon's reaper
takes what `expired()` returns and releases (leases) or aborts (reservations) it in the store.
"""

from __future__ import annotations

import enum
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.errors import LeaseLimitError, NotFoundError

logger = logging.getLogger(__name__)


class GrantKind(enum.Enum):
    LEASE = "lease"
    RESERVATION = "reservation"


@dataclass(slots=True)
class Grant:
    kind: GrantKind
    tenant: str
    handle: Any  # the store's Lease or Reservation
    deadline: float
    nbytes: int = 0


class GrantTable:
    """Open leases and reservations by id. Thread-safe; `clock` is injectable for tests."""

    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_s = lease_s
        self._clock = clock
        self._grants: dict[str, Grant] = {}
        self._lock = threading.Lock()
        self.num_expired = 0

    def add(self, kind: GrantKind, tenant: str, handle: Any, nbytes: int = 0, *,
            limit: tuple[int, int] | None = None) -> str:
        """A new grant's id. `limit` = (the tenant's, everyone's) cap on held bytes; LeaseLimitError over it."""
        grant_id = secrets.token_hex(12)
        with self._lock:
            if limit is not None:
                self._check_limit(tenant, nbytes, *limit)
            self._grants[grant_id] = Grant(kind, tenant, handle, self._clock() + self.lease_s, nbytes)
        return grant_id

    def _check_limit(self, tenant: str, nbytes: int, tenant_cap: int, total_cap: int) -> None:
        leases = [g for g in self._grants.values() if g.kind is GrantKind.LEASE]
        mine = sum(g.nbytes for g in leases if g.tenant == tenant)
        total = sum(g.nbytes for g in leases)
        if mine + nbytes > tenant_cap or total + nbytes > total_cap:
            raise LeaseLimitError(
                f"tenant {tenant!r} holds {mine} bytes of shared-memory leases (all tenants: "
                f"{total}); a tenant may hold {tenant_cap} and all together {total_cap} "
                "(service.max_lease_fraction of the host tier); release some, then retry")

    def try_take(self, grant_id: str, kind: GrantKind, tenant: str) -> Any | None:
        """Like `take`, but None (not an error) for an unknown, expired or foreign id."""
        try:
            return self.take(grant_id, kind, tenant)
        except NotFoundError:
            return None

    def take(self, grant_id: str, kind: GrantKind, tenant: str) -> Any:
        """Remove and return a grant's handle. Raises NotFoundError for unknown, expired or foreign ids."""
        with self._lock:
            grant = self._grants.get(grant_id)
            if grant is None or grant.kind is not kind or grant.tenant != tenant:
                raise NotFoundError(f"no open {kind.value} {grant_id[:32]!r} for this tenant; it was already "
                                    f"released or expired (leases last {self.lease_s:g} s)")
            del self._grants[grant_id]
            return grant.handle

    def expired(self) -> list[Grant]:
        now = self._clock()
        with self._lock:
            ids = [gid for gid, g in self._grants.items() if g.deadline <= now]
            gone = [self._grants.pop(gid) for gid in ids]
        self.num_expired += len(gone)
        if gone:
            logger.warning("reclaiming %d shared-memory grants whose clients did not release them in %g s",
                           len(gone), self.lease_s)
        return gone

    def drain(self) -> list[Grant]:
        with self._lock:
            gone, self._grants = list(self._grants.values()), {}
        return gone

    def count(self, kind: GrantKind, tenant: str | None = None) -> int:
        with self._lock:
            return sum(g.kind is kind and tenant in (None, g.tenant) for g in self._grants.values())
