"""Thread-safe counters for the store: `incr("nvme.hits")`, `snapshot()` for the stats API."""

from __future__ import annotations

import threading
from collections import defaultdict


class Counters:
    """Named monotonically increasing counters (and a few gauges set by the owner)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: defaultdict[str, int] = defaultdict(int)

    def incr(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def get(self, name: str) -> int:
        return self._values.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)
