"""Client side of the isolated shared-memory plane (service/shm_plane.py): this client's own segment.

    ClientSegment.open(call, token, slots, layout)  POST /v1/shm/segments, then receive the segment's
                                            descriptor over the daemon's unix socket and map it
    put(keys, raws)     copy each chunk into a slot, POST .../put: the daemon copies them in
    get(keys, views)    POST .../get: the daemon copies found chunks into slots; copy them out

The segment holds only this client's chunks: no other tenant's data is ever mapped here, and what
this client writes after a put does not change what the daemon stores. One call at a time (a lock):
the slots are shared by every thread of this client.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import socket
import threading
from typing import Protocol, TypeVar

import numpy as np
import torch

from kvstore.errors import KVStoreError, TierIOError
from kvstore.types import PutResult
from kvstore.wire_types import (
    ClosedAnswer,
    FoundAnswer,
    Message,
    PutAnswer,
    SegmentAnswer,
    SegmentCloseRequest,
    SegmentRequest,
    SlotsRequest,
)

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)


class Call(Protocol):
    """The client's typed call to the daemon (DaemonHTTP.call): a message out, a `kind` message back."""

    def __call__(self, method: str, path: str, body: Message | None, kind: type[M]) -> M: ...


class DescriptorSocketBusy(TierIOError):
    """The daemon's descriptor socket closed the connection without answering (past its cap of
    connections per process or in all, or its deadline): retry shortly; meanwhile a miss."""


def receive_fd(socket_path: str, segment_id: str, token: str) -> int:
    """The segment's file descriptor from the daemon's socket (SCM_RIGHTS).

    Raises:
        KVStoreError: the daemon refused (no such segment for this token).
        DescriptorSocketBusy: the socket closed without an answer.
        OSError: no daemon listens there, or it did not answer within 10 s.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10.0)
        sock.connect(socket_path)
        sock.sendall(json.dumps({"segment": segment_id, "token": token}).encode())
        message, fds, _, _ = socket.recv_fds(sock, 256, 1)
    if not fds and not message:
        raise DescriptorSocketBusy(f"the daemon's descriptor socket {socket_path} closed the connection unanswered "
                                   "(too many connections from this process or in all); retry")
    if not fds:
        raise KVStoreError(f"the daemon refused the shared-memory segment: {message.decode(errors='replace').strip()}")
    return fds[0]


class ClientSegment:
    """One mapped staging segment of `slots` chunk slots."""

    def __init__(self, call: Call, segment_id: str, slots: int, slot_bytes: int, fd: int) -> None:
        self._call = call
        self.id, self.slots, self.slot_bytes = segment_id, slots, slot_bytes
        try:
            self._map = mmap.mmap(fd, slots * slot_bytes)
        finally:
            os.close(fd)
        self._buffer = np.frombuffer(self._map, dtype=np.uint8)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, call: Call, token: str, slots: int, layout: str | None = None) -> ClientSegment:
        """A segment of `slots` chunk slots of the layout whose fingerprint is `layout` (None: the default)."""
        reply = call("POST", "/v1/shm/segments", SegmentRequest(slots=slots, layout=layout), SegmentAnswer)
        fd = receive_fd(reply.socket, reply.id, token)
        return cls(call, reply.id, reply.slots, reply.slot_bytes, fd)

    def _slot(self, index: int) -> np.ndarray:
        return self._buffer[index * self.slot_bytes:(index + 1) * self.slot_bytes]

    def slot(self, index: int) -> np.ndarray:
        """Slot `index` as a writable numpy view of the mapping."""
        return self._slot(index)

    def address(self) -> int:
        """The mapping's start address (to tell which slot a buffer occupies)."""
        return int(self._buffer.ctypes.data)

    def get_slots(self, keys: list[bytes], slots: list[int]) -> list[bool]:
        """The daemon copies found chunks into `slots` (buffers that live there: no copy here)."""
        return self._call("POST", "/v1/shm/segments/get", SlotsRequest(segment=self.id, keys=keys, slots=slots),
                          FoundAnswer).found

    def put_slots(self, keys: list[bytes], slots: list[int]) -> PutResult:
        """The daemon copies the chunks already in `slots` into its memory."""
        return self._call("POST", "/v1/shm/segments/put", SlotsRequest(segment=self.id, keys=keys, slots=slots),
                          PutAnswer).to_result()

    def put(self, keys: list[bytes], raws: list[torch.Tensor]) -> PutResult:
        with self._lock:
            for i, raw in enumerate(raws):
                np.copyto(self._slot(i), raw.cpu().numpy())
            return self.put_slots(keys, list(range(len(keys))))

    def get(self, keys: list[bytes], views: list[torch.Tensor]) -> list[bool]:
        with self._lock:
            found = self.get_slots(keys, list(range(len(keys))))
            for i, (ok, view) in enumerate(zip(found, views, strict=True)):
                if ok:
                    if view.device.type == "cpu":
                        np.copyto(view.numpy(), self._slot(i))
                    else:
                        view.copy_(torch.from_numpy(self._slot(i)))
            return found

    def close(self) -> None:
        try:
            self._call("POST", "/v1/shm/segments/close", SegmentCloseRequest(segment=self.id), ClosedAnswer)
        except (KVStoreError, OSError) as exc:  # the daemon reclaims idle segments
            logger.info("closing shared-memory segment failed (%s); the daemon reclaims it", exc)
        del self._buffer
        try:
            self._map.close()
        except BufferError:  # buffers handed out from it are still alive: unmapped once they are freed
            logger.debug("segment %s still has live buffers; unmapped when they go", self.id[:8])
