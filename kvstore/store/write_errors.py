"""Why replica writes fail, by cause: the last failure per tier (for a put's answer) and counts per errno.

A background write that fails on a full (ENOSPC), read-only (EROFS) or broken (EIO) disk is
reported with that cause, not as "queues busy": puts waiting for durability name it, and the
store's stats count `write_errors_<ERRNO>` per tier.
"""

from __future__ import annotations

import errno
import threading
import time


def cause_of(exc: BaseException) -> str:
    """ENOSPC, EROFS, EIO... for an OSError with an errno; the exception's class name otherwise."""
    code = exc.errno if isinstance(exc, OSError) else None
    return errno.errorcode.get(code, type(exc).__name__) if code else type(exc).__name__


class WriteErrors:
    """The last failed write per tier, with its time and message. Thread-safe."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def note(self, tier: str, exc: BaseException) -> str:
        """Record a failure; returns its cause."""
        cause = cause_of(exc)
        with self._lock:
            self._last[tier] = (time.monotonic(), f"{tier} write failed ({cause}): {exc}")
        return cause

    def since(self, start: float) -> list[str]:
        """Messages of the tiers whose last failure came at or after `start` (time.monotonic())."""
        with self._lock:
            return [msg for at, msg in self._last.values() if at >= start]
