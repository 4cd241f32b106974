"""Budgets for the store calls an engine waits on, and the breaker that stops asking a store that keeps
missing them. Pure Python; `connector.guarded_store` applies them.

    Deadlines       lookup / load / save budgets, the save queue's bound, the breaker's settings
    Breaker         closed -> (one timeout, or breaker_failures errors in a row) -> open
                    open   -> (breaker_cooldown_s later) -> one probe call; success closes it

The defaults keep a frozen or overloaded daemon from holding up an engine: a lookup on the scheduler's
path waits at most 0.5 s, a load 5 s (then vLLM recomputes), and after the first call that ran out of
its budget (a lookup, a load or a save) nothing waits at all until a probe succeeds: a store that did
not answer one call within its budget would make the next caller wait out its budget too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from kvstore.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Deadlines:
    """Engine-side budgets (each an option of the engine's extra config under the same name).

    Args:
        lookup_timeout_s: a prefix lookup on the scheduler's path; past it the answer is a miss.
        load_timeout_s: one batch of chunk reads; past it the chunks count as failed loads (recomputed).
        save_timeout_s: one batch of chunk writes (off the engine's path); past it they count as not stored.
        save_queue_chunks: chunks waiting to be saved; more are dropped (counted, logged once per interval).
        breaker_failures: errors in a row that open the breaker (one timeout opens it at once).
        breaker_cooldown_s: how long an open breaker answers misses before it lets one probe call through.
    """

    lookup_timeout_s: float = 0.5
    load_timeout_s: float = 5.0
    save_timeout_s: float = 10.0
    save_queue_chunks: int = 64
    breaker_failures: int = 3
    breaker_cooldown_s: float = 5.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ConfigError(f"kvstore option {f.name}={value!r} must be > 0 (default {f.default})")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Deadlines:
        """The deadline options found in an engine's extra-config map (other keys are ignored here)."""
        picked: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in data:
                kind = int if f.name in ("save_queue_chunks", "breaker_failures") else float
                try:
                    picked[f.name] = kind(data[f.name])
                except (TypeError, ValueError):
                    raise ConfigError(f"kvstore option {f.name}={data[f.name]!r} is not a number "
                                      f"(default {f.default})") from None
        return cls(**picked)

    @staticmethod
    def names() -> set[str]:
        return {f.name for f in fields(Deadlines)}

    @property
    def socket_timeout_s(self) -> float:
        """The client's own socket timeout: long enough for any budgeted call, short enough that a thread
        stuck on a frozen daemon comes back within a minute."""
        return max(self.lookup_timeout_s, self.load_timeout_s, self.save_timeout_s) * 2


class Breaker:
    """Stops calls to a store that keeps failing; lets one probe through after a cool-down. Thread-safe."""

    def __init__(self, name: str, failures: int, cooldown_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.failures, self.cooldown_s, self._clock = name, failures, cooldown_s, clock
        self._lock = threading.Lock()
        self._in_a_row = 0
        self._opened_at: float | None = None
        self._probing = False
        self.times_opened = 0

    @property
    def is_open(self) -> bool:
        with self._lock:
            return self._opened_at is not None

    def allow(self) -> bool:
        """True when a call may go to the store now (closed, or the one probe of an open breaker)."""
        with self._lock:
            if self._opened_at is None:
                return True
            if self._probing or self._clock() - self._opened_at < self.cooldown_s:
                return False
            self._probing = True
            return True

    def record(self, ok: bool, why: str = "", *, timed_out: bool = False) -> None:
        """The outcome of an allowed call; a failure that `timed_out` (the store did not answer within the
        call's budget) opens the breaker at once."""
        with self._lock:
            was_open, self._probing = self._opened_at is not None, False
            if ok:
                self._in_a_row, self._opened_at = 0, None
                if was_open:
                    logger.warning("kvstore %s: breaker closed, the store answers again", self.name)
                return
            self._in_a_row += 1
            if was_open:
                self._opened_at = self._clock()  # the probe failed: another cool-down
            elif timed_out or self._in_a_row >= self.failures:
                self._opened_at = self._clock()
                self.times_opened += 1
                cause = "a timeout" if timed_out else f"{self._in_a_row} failures in a row"
                logger.warning("kvstore %s: breaker open after %s (last: %s); lookups and loads miss and saves "
                               "are dropped for %.1f s, then one probe", self.name, cause, why, self.cooldown_s)
