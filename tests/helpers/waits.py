"""Wait on a condition, not a clock: poll a predicate until it holds or a deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_S = 0.02


def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0, *, poll_s: float = POLL_S) -> bool:
    """True as soon as `predicate()` is; False if it is still false after `timeout_s` (assert on the result)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()
