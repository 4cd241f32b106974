"""The counters a worker-side transfer adds to from loader threads and vLLM takes once per stats interval."""

from __future__ import annotations

import threading

TRANSFER_COUNTERS = ("loaded_chunks", "failed_chunks", "loaded_bytes", "load_seconds", "step_loads",
                     "background_loads", "queued_save_chunks", "saved_bytes", "save_seconds", "handoff_waits",
                     "handoff_wait_seconds")


class TransferCounters:
    """Base of PagedTransfer and StateTransfer: `counters` by name, added to under a lock (loads run on loader
    threads), taken and reset by `take_counters`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, float] = dict.fromkeys(TRANSFER_COUNTERS, 0)

    def _count(self, **values: float) -> None:
        with self._lock:
            for name, value in values.items():
                self.counters[name] += value

    def take_counters(self) -> dict[str, float]:
        """The counts since the last call (for vLLM's per-interval stats)."""
        with self._lock:
            taken, self.counters = self.counters, dict.fromkeys(self.counters, 0)
        return taken
