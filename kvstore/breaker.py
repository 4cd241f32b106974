"""`Breaker`: stop calling something that keeps failing; the connector's store calls and the Redis tier each own one.

    closed  --(`failures` failures in a row, or one call that timed out)-->  open
    open    --(`cooldown_s` later)-->  half-open: with `probe`, one call at a time goes through;
                                       without, every call goes through
    half-open --(a success)--> closed;  --(a failure)--> open for another cool-down

Configured per use: the engine side (connector/engine_store.py) opens after 3 failures or the first
timeout and lets one probe through after 5 s; the Redis tier (tiers/redis_support.py) opens on the first
connection failure and lets every call try again after `retry_after_s`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Breaker:
    """Thread-safe. `allow()` before a call; `record(ok, why)` after each allowed call.

    Args:
        name: what is guarded, named in the log lines.
        failures: failures in a row that open it (>= 1).
        cooldown_s: how long an open breaker refuses every call (>= 0).
        probe: after the cool-down, let one call through at a time (True) or every call (False).
        opens_on_timeout: a call that timed out opens it at once (else it counts as one failure).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, name: str, *, failures: int, cooldown_s: float, probe: bool = True,
                 opens_on_timeout: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        if failures < 1 or cooldown_s < 0:
            raise ValueError(f"breaker {name}: failures ({failures}) must be >= 1 and cooldown_s ({cooldown_s}) >= 0")
        self.name, self.failures, self.cooldown_s, self.probe, self._clock = name, failures, cooldown_s, probe, clock
        self.opens_on_timeout = opens_on_timeout
        self._lock = threading.Lock()
        self._in_a_row = 0
        self._opened_at: float | None = None
        self._probing = False
        self.times_opened = 0
        self.last_failure = ""

    @property
    def is_open(self) -> bool:
        """Open or half-open: the last call failed and none has succeeded since."""
        with self._lock:
            return self._opened_at is not None

    def allow(self) -> bool:
        """True when a call may go now: closed, or half-open (with `probe`, for one call at a time)."""
        with self._lock:
            if self._opened_at is None:
                return True
            if self._probing or self._clock() - self._opened_at < self.cooldown_s:
                return False
            self._probing = self.probe
            return True

    def record(self, ok: bool, why: str = "", *, timed_out: bool = False) -> None:
        """The outcome of an allowed call; a failure that `timed_out` opens it at once (`opens_on_timeout`)."""
        with self._lock:
            was_open, self._probing = self._opened_at is not None, False
            if ok:
                self._in_a_row, self._opened_at = 0, None
                if was_open:
                    logger.warning("%s: breaker closed, it answers again", self.name)
                return
            self._in_a_row += 1
            self.last_failure = why
            if was_open:
                self._opened_at = self._clock()  # the probe failed: another cool-down
            elif (timed_out and self.opens_on_timeout) or self._in_a_row >= self.failures:
                self._opened_at = self._clock()
                self.times_opened += 1
                cause = "a timeout" if timed_out and self.opens_on_timeout else f"{self._in_a_row} failures in a row"
                logger.warning("%s: breaker open after %s (last: %s); calls fail fast for %.1f s, then %s", self.name,
                               cause, why, self.cooldown_s, "one probe" if self.probe else "every call tries again")
