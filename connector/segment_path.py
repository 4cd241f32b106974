"""`SegmentPath`: the client side of `shm_plane = "segments"`: a staging segment and a chunk pool.

    put(keys, raws)    chunks in pool slots: the daemon copies them out in place (ChunkPool.put);
                       the rest: copied into the staging segment (ClientSegment.put)
    get(keys, views)   outs in pool slots: the daemon fills them in place (ChunkPool.get);
                       the rest: through the staging segment (ClientSegment.get)
    take()             a chunk buffer in the pool segment (KVStoreClient.empty_chunk), or None

Both segments are this client's own (connector/client_segment.py). A failed call drops the
segment it ran on: a call that timed out may still run in the daemon (service/abandoned.py) and
use those slots later, so they are never used again; a new segment serves the next call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import torch

from connector.chunk_pool import ChunkPool
from connector.client_segment import Call, ClientSegment
from connector.daemon_http import TRANSPORT_ERRORS, RemoteError
from kvstore.errors import KVStoreError
from kvstore.layout import KVLayout
from kvstore.types import PutResult

logger = logging.getLogger(__name__)
_T = TypeVar("_T")
SEGMENT_SLOTS = 64  # a client's shared-memory segment: at most this many chunk slots
SEGMENT_BYTES = 256 << 20  # ... and at most this many bytes


def segment_slots(max_batch_chunks: int, chunk_bytes: int) -> int:
    """Slots to ask for per segment: a batch, within SEGMENT_SLOTS and SEGMENT_BYTES."""
    return max(1, min(max_batch_chunks, SEGMENT_SLOTS, SEGMENT_BYTES // max(1, chunk_bytes)))


class SegmentPath:
    """This client's staging segment and chunk pool, each opened again after it is lost.

    Args:
        call: the client's msgpack call to the daemon (DaemonHTTP.call).
        token: the tenant's token, presented to receive each segment's descriptor.
        slots: slots per segment (see `segment_slots`).
        layout: this client's layout (the pool's buffers have its chunk shape and dtype), named in segment
            requests by `layout_fingerprint` (each slot holds one chunk of it).

    Raises:
        OSError, KVStoreError: the staging segment cannot be opened now (the caller uses HTTP).
    """

    def __init__(self, call: Call, token: str, slots: int, layout: KVLayout, layout_fingerprint: str) -> None:
        self._call, self._token, self._slots, self._layout = call, token, slots, layout
        self._fingerprint = layout_fingerprint
        self.segment: ClientSegment | None = self._open()
        self.pool: ChunkPool | None = None
        self._pool_failed = False

    def _open(self) -> ClientSegment:
        return ClientSegment.open(self._call, self._token, self._slots, self._fingerprint)

    def batch_slots(self) -> int:
        """The staging segment's slots (a batch must fit); a dropped segment reopens with as many."""
        return self._slots

    # ----- staging segment ---------------------------------------------------------------------
    def _staging(self) -> ClientSegment:
        if self.segment is None:  # dropped after a failure (e.g. the daemon restarted): a new one
            self.segment = self._open()
        return self.segment

    def _on_segment(self, fn: Callable[[ClientSegment], _T]) -> _T:
        """`fn` on the staging segment; a daemon that no longer knows it (restarted) gets a new one.
        Any other failure drops it too: a timed-out call may still use its slots in the daemon."""
        try:
            return fn(self._staging())
        except RemoteError as exc:
            self.segment = None
            if exc.status != 404:
                raise
            return fn(self._staging())
        except (*TRANSPORT_ERRORS, KVStoreError):
            self.segment = None
            raise

    # ----- chunk pool --------------------------------------------------------------------------
    def take(self) -> torch.Tensor | None:
        """A chunk buffer in a free pool slot; None when the pool is out (or cannot be had)."""
        if self.pool is None and not self._pool_failed:
            try:
                self.pool = ChunkPool(self._open(), self._layout.chunk_shape, self._layout.torch_dtype)
            except (*TRANSPORT_ERRORS, OSError, KVStoreError) as exc:
                self._pool_failed = True  # e.g. the tenant's segment cap: ordinary buffers from now on
                logger.info("kvstore client: no chunk pool segment (%s); empty_chunk() is ordinary memory", exc)
        return self.pool.take() if self.pool is not None else None

    def _pool_slots(self, raws: list[torch.Tensor]) -> list[int | None]:
        """Each buffer's slot in the pool, None for those elsewhere (or a slot already named in the batch)."""
        pool = self.pool
        if pool is None:
            return [None] * len(raws)
        slots: list[int | None] = []
        seen: set[int] = set()
        for raw in raws:
            slot = pool.slot_of(raw)
            slots.append(slot if slot is not None and slot not in seen else None)
            seen.add(slot if slot is not None else -1)
        return slots

    def _pooled(self, fn: Callable[[ChunkPool], _T]) -> _T | None:
        """`fn` on the pool; None when the daemon lost its segment (404). Any failure retires the pool: a
        call that timed out may still run in the daemon (service/abandoned.py) and write into or read
        from its slots later, so those slots are never handed out again."""
        assert self.pool is not None
        try:
            return fn(self.pool)
        except (*TRANSPORT_ERRORS, KVStoreError) as exc:
            self._drop_pool(exc)
            if isinstance(exc, RemoteError) and exc.status == 404:
                return None
            raise

    def _drop_pool(self, exc: Exception) -> None:
        """The pool segment is lost (daemon restarted, idle-reaped) or a call on it failed: its buffers
        take the copy path and its slots are never reused."""
        logger.info("kvstore client: chunk pool retired (%s); a new one serves later empty_chunk() calls", exc)
        if self.pool is not None:
            self.pool.closed = True
        self.pool = None

    # ----- data path ---------------------------------------------------------------------------
    def put(self, keys: list[bytes], raws: list[torch.Tensor]) -> PutResult:
        """Chunks in pool slots go without a copy here; the rest through the staging segment."""
        slots = self._pool_slots(raws)
        pooled = [i for i, s in enumerate(slots) if s is not None]
        result = PutResult()
        if pooled and self.pool is not None:
            part = self._pooled(lambda pool: pool.put([keys[i] for i in pooled], [slots[i] for i in pooled]))  # type: ignore[misc]
            if part is None:
                slots = [None] * len(raws)
            else:
                result.merge(part)
        rest = [i for i, s in enumerate(slots) if s is None]
        if rest:
            part_keys, part_raws = [keys[i] for i in rest], [raws[i] for i in rest]
            result.merge(self._on_segment(lambda segment: segment.put(part_keys, part_raws)))
        return result

    def get(self, keys: list[bytes], views: list[torch.Tensor]) -> list[bool]:
        """Outs in pool slots are filled by the daemon directly; the rest through the staging segment."""
        slots = self._pool_slots(views)
        found = [False] * len(keys)
        pooled = [i for i, s in enumerate(slots) if s is not None]
        if pooled and self.pool is not None:
            hits = self._pooled(lambda pool: pool.get([keys[i] for i in pooled], [slots[i] for i in pooled]))  # type: ignore[misc]
            if hits is None:
                slots = [None] * len(keys)
            else:
                for i, hit in zip(pooled, hits, strict=True):
                    found[i] = hit
        rest = [i for i, s in enumerate(slots) if s is None]
        if rest:
            part_keys, part_views = [keys[i] for i in rest], [views[i] for i in rest]
            for i, hit in zip(rest, self._on_segment(lambda segment: segment.get(part_keys, part_views)), strict=True):
                found[i] = hit
        return found

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.segment is not None:
            self.segment.close()
            self.segment = None

