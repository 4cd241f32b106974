"""Chunk buffers that live in this client's own shared-memory segment, so a get needs one copy.

    ChunkPool(segment, shape, dtype)
      take()          a chunk tensor backed by a free slot of the segment, or None when all are out
      slot_of(t)      the slot a tensor occupies (None: not one of this pool's live buffers)

`SegmentPath` (connector/segment_path.py) asks the daemon to copy found chunks straight into those
slots, or chunks straight out of them: nothing is copied on this side.

`KVStoreClient.empty_chunk()` hands these out. A slot returns to the pool when the last tensor
sharing its memory is freed (weakref.finalize on the numpy view that the tensor's storage holds),
so the pool never grows: when every slot is out, callers get ordinary memory and the copy path.
The segment is this client's own memfd (see connector/client_segment.py): no other tenant maps it,
and the daemon checks every slot number against the segment.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import torch

from connector.client_segment import ClientSegment


class ChunkPool:
    """A bounded pool of chunk buffers in one dedicated segment. Thread-safe."""

    def __init__(self, segment: ClientSegment, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.segment, self.shape, self.dtype = segment, shape, dtype
        self._base = segment.address()
        self._free = list(range(segment.slots - 1, -1, -1))
        self._out: set[int] = set()
        self._lock = threading.Lock()
        self.closed = False

    def take(self) -> torch.Tensor | None:
        with self._lock:
            if self.closed or not self._free:
                return None
            index = self._free.pop()
            self._out.add(index)
        view: np.ndarray = self.segment.slot(index)
        weakref.finalize(view, self._give_back, index)  # fires when the last tensor on this slot is freed
        return torch.from_numpy(view).view(self.dtype).reshape(self.shape)

    def _give_back(self, index: int) -> None:
        with self._lock:
            if index in self._out:
                self._out.discard(index)
                self._free.append(index)

    def slot_of(self, chunk: torch.Tensor) -> int | None:
        """The slot `chunk` (a whole-chunk byte view) occupies, if it is one of this pool's live buffers."""
        if self.closed or chunk.device.type != "cpu" or chunk.numel() * chunk.element_size() != self.segment.slot_bytes:
            return None
        offset = chunk.data_ptr() - self._base
        index, rest = divmod(offset, self.segment.slot_bytes)
        with self._lock:
            return index if rest == 0 and 0 <= offset and index in self._out else None

    def in_use(self) -> int:
        with self._lock:
            return len(self._out)

    def retire(self) -> None:
        """Hand out no more buffers (those still held stay valid memory of this process until freed)."""
        with self._lock:
            self.closed = True
