"""What the paged and the state transfer share: counters added to from loader threads and taken once per stats
interval by vLLM, and the hand-over of gathered chunks to the store's save queue."""

from __future__ import annotations

import threading
import time

import torch

from connector.engine_store import EngineStore

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

    def _queue_saves(self, store: EngineStore, keys: list[bytes], chunks: list[torch.Tensor], chunk_bytes: int,
                     start: float) -> None:
        """Hand the gathered chunks to the store's bounded save queue and count them (started at `start`)."""
        if keys:
            queued = store.save_async(keys, chunks)
            self._count(queued_save_chunks=queued, saved_bytes=queued * chunk_bytes,
                        save_seconds=time.perf_counter() - start)
