"""`ClusterHealth`: is the node's link to Redis ok, slow or down; one log line per change; /healthz status.

Redis down or slow never fails a request: the node keeps serving from its local tiers, says
"degraded" here, bounds what it queues for Redis (drop-oldest, counted) and resyncs on return.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kvstore.redact import redact_url

logger = logging.getLogger(__name__)


class ClusterHealth:
    """Thread-safe state of one node's Redis link.

    Args:
        url: the Redis URL, for messages.
        slow_s: a round trip slower than this marks the link degraded ("slow").
        retry_s: while down, how long to wait before trying Redis again (`should_try`).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, url: str, *, slow_s: float, retry_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.url, self.slow_s, self.retry_s, self._clock = redact_url(url), slow_s, retry_s, clock
        self._lock = threading.Lock()
        self.state = "ok"
        self.reason = ""
        self._since = clock()
        self._next_try = 0.0
        self.num_failures = 0
        self.num_dropped_events = 0
        self.num_resyncs = 0
        self.last_round_trip_s = 0.0

    @property
    def is_ok(self) -> bool:
        return self.state == "ok"

    def should_try(self) -> bool:
        """Whether to talk to Redis now (always when ok; every `retry_s` when degraded by a failure)."""
        return self.state != "down" or self._clock() >= self._next_try

    def succeeded(self, round_trip_s: float) -> None:
        self.last_round_trip_s = round_trip_s
        if round_trip_s > self.slow_s:
            self._set("slow", f"Redis round trip {round_trip_s * 1e3:.0f} ms > {self.slow_s * 1e3:.0f} ms")
        else:
            self._set("ok", "")

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            self.num_failures += 1
            self._next_try = self._clock() + self.retry_s
        self._set("down", f"{type(exc).__name__}: {exc}")

    def dropped(self, count: int = 1) -> None:
        with self._lock:
            self.num_dropped_events += count

    def resynced(self) -> None:
        with self._lock:
            self.num_resyncs += 1

    def _set(self, state: str, reason: str) -> None:
        with self._lock:
            if state == self.state:
                self.reason = reason or self.reason
                return
            old, self.state, self.reason, self._since = self.state, state, reason, self._clock()
        if state == "ok":
            logger.info("cluster: Redis at %s is ok again (was %s)", self.url, old)
        else:
            logger.warning("cluster: Redis at %s is %s (%s); serving from local tiers only, events queued (bounded)",
                           self.url, state, reason)

    def status(self, **extra: object) -> dict[str, object]:
        """What /healthz shows: {"redis": "ok"|"degraded", "state": "ok"|"slow"|"down", ...}."""
        with self._lock:
            return {"redis": "ok" if self.state == "ok" else "degraded", "state": self.state, "reason": self.reason,
                    "since_s": round(self._clock() - self._since, 3), "url": self.url,
                    "failures": self.num_failures, "dropped_events": self.num_dropped_events,
                    "resyncs": self.num_resyncs, "round_trip_ms": round(self.last_round_trip_s * 1e3, 3), **extra}
