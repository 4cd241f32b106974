"""`MemoryBudgets`: the daemon memory each tenant causes outside its chunk quota, charged to it and capped.

    charged to the tenant                      while
    its shared-memory segments (memfd bytes)   the segment is open (closed, idle-reaped, or its
                                               client process gone: service/shm_plane.py)
    staging of its HTTP requests               the store call runs: a put's copy of the body, a
                                               get's response buffer

The chunk quota ([[service.tenants]] quota) bounds what a tenant stores; this budget
(service.tenant_memory_bytes, or the tenant's own `memory`) bounds the rest, so a tenant with a
small quota cannot make the daemon hold hundreds of MiB of segments. Past it a request is refused
with 429 (MemoryBudgetError) naming the budget and the fix. Thread-safe.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping

from kvstore.units import format_bytes
from service.errors import MemoryBudgetError


class MemoryBudgets:
    """Bytes charged per tenant name against its limit (`limits[name]`, else `default_bytes`)."""

    def __init__(self, default_bytes: int, limits: Mapping[str, int] | None = None) -> None:
        self.default_bytes = default_bytes
        self._limits = dict(limits or {})
        self._used: dict[str, int] = {}
        self._lock = threading.Lock()

    def limit(self, tenant: str) -> int:
        return self._limits.get(tenant, self.default_bytes)

    def used(self, tenant: str) -> int:
        with self._lock:
            return self._used.get(tenant, 0)

    def total(self) -> int:
        """Bytes charged now, every tenant together."""
        with self._lock:
            return sum(self._used.values())

    def charge(self, tenant: str, nbytes: int, what: str) -> None:
        """Charge `nbytes` for `what` (e.g. "a 64-slot segment"); MemoryBudgetError (429) past the limit."""
        limit = self.limit(tenant)
        with self._lock:
            used = self._used.get(tenant, 0)
            if used + nbytes > limit:
                raise MemoryBudgetError(
                    f"tenant {tenant!r}: {what} needs {format_bytes(nbytes)} of daemon memory but "
                    f"{format_bytes(used)} of its memory budget of {format_bytes(limit)} is in use (open shared-memory "
                    "segments and in-flight request buffers; service.tenant_memory_bytes, or the tenant's memory = "
                    "...): close segments it no longer uses, send smaller batches, or raise the budget")
            self._used[tenant] = used + nbytes

    def release(self, tenant: str, nbytes: int) -> None:
        with self._lock:
            left = self._used.get(tenant, 0) - nbytes
            if left > 0:
                self._used[tenant] = left
            else:
                self._used.pop(tenant, None)

    @contextlib.contextmanager
    def hold(self, tenant: str, nbytes: int, what: str) -> Iterator[None]:
        """Charged for the duration of the block (a request's staging buffer)."""
        self.charge(tenant, nbytes, what)
        try:
            yield
        finally:
            self.release(tenant, nbytes)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._used)
