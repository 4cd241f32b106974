"""`ResponseBuffers`: reusable host buffers for batch-get answers, so a get does not fault in fresh pages.

A 32 MiB `torch.empty` is a fresh mmap each time: the store's copy into it then takes a page
fault per 4 KiB page (8192 per 32 MiB), which costs about as much as the copy itself. A buffer
goes back to the free list once its response has been sent (a Starlette background task); at most
`max_free_bytes` stay parked, the rest return to the allocator.
"""

from __future__ import annotations

import logging
import threading

import torch

logger = logging.getLogger(__name__)


class ResponseBuffers:
    """A bounded free list of uint8 host buffers keyed by size. Thread-safe."""

    def __init__(self, max_free_bytes: int) -> None:
        self.max_free_bytes = max_free_bytes
        self._free: dict[int, list[torch.Tensor]] = {}
        self._free_bytes = 0
        self._lock = threading.Lock()

    @property
    def parked_bytes(self) -> int:
        """Bytes of the buffers parked for reuse now."""
        return self._free_bytes

    def take(self, nbytes: int) -> torch.Tensor:
        """A buffer of exactly `nbytes` (contents undefined): a parked one when there is one."""
        with self._lock:
            parked = self._free.get(nbytes)
            if parked:
                self._free_bytes -= nbytes
                return parked.pop()
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, buffer: torch.Tensor) -> None:
        """Park `buffer` for reuse (the caller no longer reads or writes it), unless the list is full."""
        nbytes = buffer.numel()
        with self._lock:
            if self._free_bytes + nbytes <= self.max_free_bytes:
                self._free.setdefault(nbytes, []).append(buffer)
                self._free_bytes += nbytes
