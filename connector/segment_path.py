"""`SegmentPath`: the client side of the shared-memory plane: a staging segment and a chunk pool.

    put(keys, raws)    chunks in pool slots: the daemon copies them out in place (POST .../put);
                       the rest: copied into the staging segment, then POST .../put
    get(keys, views)   outs in pool slots: the daemon fills them in place (POST .../get);
                       the rest: POST .../get into the staging segment, then copied out
    take()             a chunk buffer in the pool segment (KVStoreClient.empty_chunk), or None

Both segments are this client's own (connector/client_segment.py maps them, connector/chunk_pool.py
hands out the pool's slots); every call to the daemon about them is made here, through `DaemonHTTP`
within the calling thread's deadline (the call's budget, connector/deadlines.py). A failed call drops the
segment it ran on: a call that timed out may still run in the daemon (service/abandoned.py) and
use those slots later, so they are never used again; a new segment serves the next call.

`take()` runs on an engine's step (a save gathers its chunks into these buffers), so it never waits
for the daemon: the pool is opened on a thread of its own, started by the first `take()`, and until
it is open `take()` answers None (the caller uses ordinary memory, the copy path). A pool that
cannot be opened, or is lost, is tried again in the background after a pause that doubles from
POOL_RETRY_FIRST_S to POOL_RETRY_MAX_S, one try at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from connector.chunk_pool import ChunkPool
from connector.client_segment import ClientSegment, receive_fd
from connector.daemon_http import TRANSPORT_ERRORS, DaemonHTTP, RemoteError
from kvstore.errors import KVStoreError
from kvstore.layout import KVLayout
from kvstore.types import PutResult
from kvstore.wire_types import (
    ClosedAnswer,
    FoundAnswer,
    PutAnswer,
    SegmentAnswer,
    SegmentCloseRequest,
    SegmentRequest,
    SlotsRequest,
)

logger = logging.getLogger(__name__)
_T = TypeVar("_T")
SEGMENT_SLOTS = 64  # a client's shared-memory segment: at most this many chunk slots
SEGMENT_BYTES = 256 << 20  # ... and at most this many bytes
POOL_RETRY_FIRST_S, POOL_RETRY_MAX_S = 1.0, 60.0  # pause before the pool is tried again: doubles up to the max


def segment_slots(max_batch_chunks: int, chunk_bytes: int) -> int:
    """Slots to ask for per segment: a batch, within SEGMENT_SLOTS and SEGMENT_BYTES."""
    return max(1, min(max_batch_chunks, SEGMENT_SLOTS, SEGMENT_BYTES // max(1, chunk_bytes)))


class SegmentPath:
    """This client's staging segment and chunk pool, each opened again after it is lost.

    Args:
        http: the client's connection to the daemon.
        token: the tenant's token, presented to receive each segment's descriptor.
        slots: slots per segment (see `segment_slots`).
        layout: this client's layout (the pool's buffers have its chunk shape and dtype), named in segment
            requests by `layout_fingerprint` (each slot holds one chunk of it).

    Raises:
        OSError, KVStoreError: the staging segment cannot be opened now (the caller uses HTTP).
    """

    def __init__(self, http: DaemonHTTP, token: str, slots: int, layout: KVLayout, layout_fingerprint: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._http, self._token, self._slots, self._layout, self._clock = http, token, slots, layout, clock
        self._fingerprint = layout_fingerprint
        self.segment: ClientSegment | None = self._open()
        self.pool: ChunkPool | None = None
        self._pool_changed = threading.Condition()  # guards the pool's state below and `pool`
        self._opening = False  # a background open is in flight
        self._next_open_at = 0.0  # no open is started before this (clock)
        self._retry_s = POOL_RETRY_FIRST_S
        self._closed = False

    def _open(self) -> ClientSegment:
        """A new segment of `slots` slots of this client's layout: POST /v1/shm/segments, then its descriptor."""
        reply = self._http.call("POST", "/v1/shm/segments", SegmentRequest(slots=self._slots, layout=self._fingerprint),
                                SegmentAnswer)
        fd = receive_fd(reply.socket, reply.id, self._token, self._http.left_s())
        return ClientSegment(reply.id, reply.slots, reply.slot_bytes, fd)

    def _close(self, segment: ClientSegment) -> None:
        try:
            self._http.call("POST", "/v1/shm/segments/close", SegmentCloseRequest(segment=segment.id), ClosedAnswer)
        except (KVStoreError, OSError) as exc:  # the daemon reclaims idle segments
            logger.info("closing shared-memory segment failed (%s); the daemon reclaims it", exc)
        segment.unmap()

    def _get_slots(self, segment: ClientSegment, keys: list[bytes], slots: list[int]) -> list[bool]:
        """The daemon copies the found chunks into `slots` of `segment`."""
        asked = SlotsRequest(segment=segment.id, keys=keys, slots=slots)
        return self._http.call("POST", "/v1/shm/segments/get", asked, FoundAnswer).found

    def _put_slots(self, segment: ClientSegment, keys: list[bytes], slots: list[int]) -> PutResult:
        """The daemon copies the chunks already in `slots` of `segment` into its store."""
        asked = SlotsRequest(segment=segment.id, keys=keys, slots=slots)
        return self._http.call("POST", "/v1/shm/segments/put", asked, PutAnswer).to_result()

    def _staged_put(self, segment: ClientSegment, keys: list[bytes], raws: list[torch.Tensor]) -> PutResult:
        with segment.lock:
            return self._put_slots(segment, keys, segment.copy_in(raws))

    def _staged_get(self, segment: ClientSegment, keys: list[bytes], views: list[torch.Tensor]) -> list[bool]:
        with segment.lock:
            found = self._get_slots(segment, keys, list(range(len(keys))))
            segment.copy_out(found, views)
            return found

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
        """A chunk buffer in a free pool slot; None when the pool is out, not open yet or cannot be had
        (the caller uses ordinary memory). Never waits for the daemon: a missing pool is opened in the
        background (`_open_pool`)."""
        with self._pool_changed:
            pool = self.pool
            if pool is None:
                self._start_open()
        return pool.take() if pool is not None else None

    def wait_pool(self, timeout_s: float) -> bool:
        """Start opening the pool if it is not open, and wait up to `timeout_s` for it (off an engine's
        path: tests, a client that wants one-copy buffers from its first call). True when it is open."""
        deadline = self._clock() + timeout_s
        with self._pool_changed:
            while self.pool is None and not self._closed:
                self._start_open()
                left = deadline - self._clock()
                if left <= 0:
                    return False
                self._pool_changed.wait(min(left, POOL_RETRY_FIRST_S))
            return self.pool is not None

    def _start_open(self) -> None:
        """One background open at a time, none while the pause after a failure runs (under _pool_changed)."""
        if self._opening or self._closed or self._clock() < self._next_open_at:
            return
        self._opening = True
        threading.Thread(target=self._open_pool, name="kvstore-pool-open", daemon=True).start()

    def _open_pool(self) -> None:
        pool: ChunkPool | None = None
        failure: Exception | None = None
        try:
            pool = ChunkPool(self._open(), self._layout.chunk_shape, self._layout.torch_dtype)
        except (*TRANSPORT_ERRORS, OSError, KVStoreError) as exc:  # e.g. a frozen daemon, the tenant's segment cap
            failure = exc
        finally:
            with self._pool_changed:
                self._opening, pause = False, self._retry_s
                if pool is None:
                    self._next_open_at, self._retry_s = self._clock() + pause, min(pause * 2, POOL_RETRY_MAX_S)
                elif not self._closed:
                    self.pool, pool, self._retry_s = pool, None, POOL_RETRY_FIRST_S
                self._pool_changed.notify_all()
        if pool is not None:  # the path was closed meanwhile
            self._close(pool.segment)
        if failure is not None:
            logger.info("kvstore client: no chunk pool segment (%s); empty_chunk() gives ordinary memory, next "
                        "try in %.0f s", failure, pause)

    @staticmethod
    def _pool_slots(pool: ChunkPool | None, raws: list[torch.Tensor]) -> list[int | None]:
        """Each buffer's slot in `pool`, None for those elsewhere (or a slot already named in the batch)."""
        if pool is None:
            return [None] * len(raws)
        slots: list[int | None] = []
        seen: set[int] = set()
        for raw in raws:
            slot = pool.slot_of(raw)
            slots.append(slot if slot is not None and slot not in seen else None)
            seen.add(slot if slot is not None else -1)
        return slots

    def _pooled(self, pool: ChunkPool, fn: Callable[[ChunkPool], _T]) -> _T | None:
        """`fn` on `pool`; None when the daemon lost its segment (404). Any failure retires the pool: a
        call that timed out may still run in the daemon (service/abandoned.py) and write into or read
        from its slots later, so those slots are never handed out again."""
        try:
            return fn(pool)
        except (*TRANSPORT_ERRORS, KVStoreError) as exc:
            self._drop_pool(pool, exc)
            if isinstance(exc, RemoteError) and exc.status == 404:
                return None
            raise

    def _drop_pool(self, pool: ChunkPool, exc: Exception) -> None:
        """The pool segment is lost (daemon restarted, idle-reaped) or a call on it failed: its buffers
        take the copy path and its slots are never reused; a new pool is opened after a pause."""
        logger.info("kvstore client: chunk pool retired (%s); a new one serves later empty_chunk() calls", exc)
        pool.retire()
        with self._pool_changed:
            if self.pool is pool:
                self.pool, self._next_open_at = None, self._clock() + self._retry_s

    # ----- data path ---------------------------------------------------------------------------
    def put(self, keys: list[bytes], raws: list[torch.Tensor]) -> PutResult:
        """Chunks in pool slots go without a copy here; the rest through the staging segment."""
        pool = self.pool
        slots = self._pool_slots(pool, raws)
        pooled = [i for i, s in enumerate(slots) if s is not None]
        result = PutResult()
        if pooled and pool is not None:
            part = self._pooled(pool, lambda p: self._put_slots(p.segment, [keys[i] for i in pooled],
                                                                [slots[i] for i in pooled]))  # type: ignore[misc]
            if part is None:
                slots = [None] * len(raws)
            else:
                result.merge(part)
        rest = [i for i, s in enumerate(slots) if s is None]
        if rest:
            part_keys, part_raws = [keys[i] for i in rest], [raws[i] for i in rest]
            result.merge(self._on_segment(lambda segment: self._staged_put(segment, part_keys, part_raws)))
        return result

    def get(self, keys: list[bytes], views: list[torch.Tensor]) -> list[bool]:
        """Outs in pool slots are filled by the daemon directly; the rest through the staging segment."""
        pool = self.pool
        slots = self._pool_slots(pool, views)
        found = [False] * len(keys)
        pooled = [i for i, s in enumerate(slots) if s is not None]
        if pooled and pool is not None:
            hits = self._pooled(pool, lambda p: self._get_slots(p.segment, [keys[i] for i in pooled],
                                                                [slots[i] for i in pooled]))  # type: ignore[misc]
            if hits is None:
                slots = [None] * len(keys)
            else:
                for i, hit in zip(pooled, hits, strict=True):
                    found[i] = hit
        rest = [i for i, s in enumerate(slots) if s is None]
        if rest:
            part_keys, part_views = [keys[i] for i in rest], [views[i] for i in rest]
            hits = self._on_segment(lambda segment: self._staged_get(segment, part_keys, part_views))
            for i, hit in zip(rest, hits, strict=True):
                found[i] = hit
        return found

    def close(self) -> None:
        with self._pool_changed:
            pool, self.pool, self._closed = self.pool, None, True  # an open in flight closes what it gets
            self._pool_changed.notify_all()
        if pool is not None:
            pool.retire()
            self._close(pool.segment)
        if self.segment is not None:
            self._close(self.segment)
            self.segment = None

