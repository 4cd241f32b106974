"""`SaveQueue`: an engine store's saves off the engine's path: a bounded queue drained by one thread.

    offer(keys, chunks)  queue what fits within `bound_chunks`; the rest is dropped (counted, logged once
                         per interval): the engine's step never waits for a save
    join()               wait until every queued save has been handed to the store (tests, flush)

The thread starts with the first save and hands each batch to `put` (EngineStore.put_many: within the
save budget, failures counted as unsaved chunks, never raised to the engine).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import torch

from kvstore.errors import KVStoreError
from kvstore.types import PutResult

logger = logging.getLogger(__name__)
_DROP_LOG_INTERVAL_S = 10.0


class SaveQueue:
    """Thread-safe. `count(name, n)` adds to the owner's counters (dropped_save_chunks, unsaved_chunks)."""

    def __init__(self, put: Callable[[list[bytes], list[torch.Tensor]], PutResult], bound_chunks: int, name: str,
                 count: Callable[[str, int], None]) -> None:
        self._put, self.bound_chunks, self.name, self._count = put, bound_chunks, name, count
        self._items: queue.Queue[tuple[list[bytes], list[torch.Tensor]] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._queued_chunks = 0
        self._dropped_chunks = 0
        self._last_drop_log = 0.0
        self._thread: threading.Thread | None = None

    def offer(self, keys: list[bytes], chunks: list[torch.Tensor]) -> int:
        """Queue chunks for saving; returns how many were queued (the rest were dropped, counted)."""
        with self._lock:
            taken = min(max(0, self.bound_chunks - self._queued_chunks), len(keys))
            self._queued_chunks += taken
            if taken and self._thread is None:
                self._thread = threading.Thread(target=self._drain, name=f"kvstore-{self.name}-save", daemon=True)
                self._thread.start()
        if len(keys) > taken:
            self._dropped(len(keys) - taken)
        if taken:
            self._items.put((keys[:taken], chunks[:taken]))
        return taken

    def _dropped(self, n: int) -> None:
        self._count("dropped_save_chunks", n)
        now = time.monotonic()
        with self._lock:
            self._dropped_chunks += n
            if now - self._last_drop_log < _DROP_LOG_INTERVAL_S:
                return
            self._last_drop_log = now
        logger.warning("kvstore %s: save queue full (%d chunks): %d chunks dropped so far; the store cannot keep up "
                       "(raise save_queue_chunks, or check the daemon)", self.name, self.bound_chunks,
                       self._dropped_chunks)

    def _drain(self) -> None:
        while (item := self._items.get()) is not None:
            keys, chunks = item
            try:
                result = self._put(keys, chunks)
                self._count("unsaved_chunks", len(result.not_stored))
                if result.not_stored:
                    logger.debug("kvstore %s: %d chunks not stored (%s)", self.name, len(result.not_stored),
                                 next(iter(result.not_stored.values())))
            except KVStoreError as exc:  # bad input: the engine gave chunks of another layout
                self._count("unsaved_chunks", len(keys))
                logger.warning("kvstore %s: save of %d chunks refused: %s", self.name, len(keys), exc)
            finally:
                with self._lock:
                    self._queued_chunks -= len(keys)
                self._items.task_done()

    def join(self) -> None:
        self._items.join()

    def close(self, timeout_s: float) -> None:
        """Stop the thread once the queued saves are handed over (at most `timeout_s`)."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            self._items.put(None)
            thread.join(timeout=timeout_s)
