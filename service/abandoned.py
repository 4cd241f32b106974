"""Store calls whose deadline passed: counted while their threads still run, and capped.

A route runs each blocking store call on a worker thread (`Runtime.run`) and answers 503 when the
call's deadline passes. Python cannot stop a thread, so the call is abandoned, not cancelled: it
keeps running until the backend returns (a paused Redis: its socket timeout; a hung disk: never),
and anyio hands its capacity-limiter token back at once, so the next request starts a new thread.
Without a cap, a stalled backend under load therefore grows the daemon by one thread (plus the
request body or response buffer it holds) per request. `AbandonedCalls` counts the abandoned calls
still running; at `service.max_abandoned_calls` new store calls are refused at once with 503 and a
message naming the cause, until the stalled calls return. Counters are in the admin's /v1/stats
(`service.abandoned_calls`, `abandoned_bytes`: the request bodies and keys they hold, `abandoned_total`,
`refused_abandoned`). So at most max_abandoned_calls extra threads run, holding at most
max_abandoned_calls x service.max_body_bytes of bodies (a get holds its response buffer instead,
at most max_batch_chunks chunks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from service.errors import TooManyAbandonedError

T = TypeVar("T")


class TrackedCall(Generic[T]):
    """One store call on a worker thread; `abandon()` when its deadline passed while it may still run."""

    def __init__(self, ledger: AbandonedCalls, fn: Callable[..., T], args: tuple[object, ...]) -> None:
        self._ledger = ledger
        self._fn = fn
        self._args = args
        self._started = self._done = self._abandoned = False
        self.nbytes = sum(memoryview(a).nbytes for a in args if isinstance(a, (bytes, bytearray, memoryview)))

    def __call__(self) -> T:
        with self._ledger.lock:
            self._started = True
            if self._abandoned:  # its worker picked it up after the deadline passed
                self._ledger.add(self.nbytes)
        try:
            return self._fn(*self._args)
        finally:
            with self._ledger.lock:
                self._done = True
                if self._abandoned:
                    self._ledger.add(-self.nbytes, -1)

    def abandon(self) -> None:
        """The route answered 503 (or was cancelled); the call counts as abandoned while its thread still
        runs it. A call already done is not abandoned."""
        with self._ledger.lock:
            if self._abandoned or self._done:
                return
            self._abandoned = True
            self._ledger.total += 1
            if self._started and not self._done:
                self._ledger.add(self.nbytes)


class AbandonedCalls:
    """How many store calls run on past their deadline; at `limit`, new calls are refused."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        self.in_flight = 0  # abandoned calls whose thread is still running
        self.held_bytes = 0  # the request bodies they hold (a put's chunks)
        self.total = 0  # calls ever abandoned
        self.refused = 0  # calls refused because in_flight reached the limit

    def track(self, fn: Callable[..., T], args: tuple[object, ...], *, refuse: bool = True) -> TrackedCall[T]:
        """A call to run on a worker thread. Raises TooManyAbandonedError at the cap (unless `refuse` is
        False: for calls that cannot wait on a backend, such as a lookup of this node's index only)."""
        with self.lock:
            if refuse and self.in_flight >= self.limit:
                self.refused += 1
                raise TooManyAbandonedError(
                    f"{self.in_flight} timed-out store calls are still running (service.max_abandoned_calls = "
                    f"{self.limit}): a disk or Redis has stalled; new calls are refused until they return. "
                    "Retry later; check the daemon log and the tiers' health")
        return TrackedCall(self, fn, args)

    def add(self, nbytes: int, calls: int = 1) -> None:
        """Count a call (and its body bytes) in or out of the abandoned ones; the caller holds `lock`."""
        self.in_flight += calls
        self.held_bytes += nbytes

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"abandoned_calls": self.in_flight, "abandoned_bytes": self.held_bytes, "abandoned_limit": self.limit,
                    "abandoned_total": self.total, "refused_abandoned": self.refused}
