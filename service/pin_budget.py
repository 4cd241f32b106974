"""How long one tenant may keep a chunk pinned with shared-memory read leases (renewals bounded).

    PinBudget(max_pin_s, window_s).check(tenant, keys)   LeaseLimitError when a key is over budget

Within each window of `window_s`, counted from a tenant's first lease on a key, the tenant may take
new leases on that key during the first `max_pin_s` only; later ones are refused (429: the client
reads over HTTP instead) until the window ends. With leases lasting `lease_s`, a client that keeps
re-acquiring pins a chunk at most `max_pin_s + lease_s` of every `window_s`, so other tenants' puts
can evict it in the rest. Entries older than a window are dropped, so the table stays bounded by
the keys leased within one window.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from service.errors import LeaseLimitError


class PinBudget:
    """Per (tenant, key) lease windows. Thread-safe; `clock` is injectable for tests."""

    def __init__(self, max_pin_s: float, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_pin_s, self.window_s, self._clock = max_pin_s, window_s, clock
        self._starts: OrderedDict[tuple[str, bytes], float] = OrderedDict()  # oldest window first
        self._lock = threading.Lock()
        self.num_refused = 0

    def check(self, tenant: str, keys: Sequence[bytes]) -> None:
        """Open or continue each key's window; LeaseLimitError (nothing recorded) if any is past its budget."""
        now = self._clock()
        with self._lock:
            self._prune(now)
            over = [k for k in keys if now - self._starts.get((tenant, k), now) >= self.max_pin_s]
            if over:
                self.num_refused += 1
                raise LeaseLimitError(
                    f"tenant {tenant!r} has kept {len(over)} of these chunks leased for service.max_pin_s = "
                    f"{self.max_pin_s:g} s within the last {self.window_s:g} s (service.pin_window_s); read them "
                    "over HTTP (the client does so by itself) until the window ends")
            for key in keys:
                self._starts.setdefault((tenant, key), now)

    def _prune(self, now: float) -> None:
        while self._starts:
            entry, start = next(iter(self._starts.items()))
            if now - start < self.window_s:
                return
            del self._starts[entry]

    def __len__(self) -> int:
        with self._lock:
            return len(self._starts)
