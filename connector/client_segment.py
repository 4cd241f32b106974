"""A shared-memory segment of this client's own, mapped here (service/shm_plane.py is the daemon's side).

    receive_fd(socket, id, token)   the segment's descriptor from the daemon's unix socket (SCM_RIGHTS)
    ClientSegment(id, slots, slot_bytes, fd)   the mapping: slot views, chunks copied in and out

The segment holds only this client's chunks: no other tenant's data is ever mapped here, and what
this client writes after a put does not change what the daemon stores. It makes no call to the daemon:
`SegmentPath` (connector/segment_path.py) opens and closes segments and asks the daemon to copy slots.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import socket
import threading

import numpy as np
import torch

from kvstore.errors import KVStoreError, TierIOError

logger = logging.getLogger(__name__)


class DescriptorSocketBusy(TierIOError):
    """The daemon's descriptor socket closed the connection without answering (past its cap of
    connections per process or in all, or its deadline): retry shortly; meanwhile a miss."""


def receive_fd(socket_path: str, segment_id: str, token: str, timeout_s: float = 10.0) -> int:
    """The segment's file descriptor from the daemon's socket (SCM_RIGHTS), within `timeout_s`.

    Raises:
        KVStoreError: the daemon refused (no such segment for this token).
        DescriptorSocketBusy: the socket closed without an answer.
        OSError: no daemon listens there, or it did not answer within `timeout_s`.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
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
    """One mapped segment of `slots` chunk slots. `lock` serialises the staging use of its slots (they are
    shared by every thread of this client)."""

    def __init__(self, segment_id: str, slots: int, slot_bytes: int, fd: int) -> None:
        self.id, self.slots, self.slot_bytes = segment_id, slots, slot_bytes
        try:
            self._map = mmap.mmap(fd, slots * slot_bytes)
        finally:
            os.close(fd)
        self._buffer = np.frombuffer(self._map, dtype=np.uint8)
        self.lock = threading.Lock()

    def slot(self, index: int) -> np.ndarray:
        """Slot `index` as a writable numpy view of the mapping."""
        return self._buffer[index * self.slot_bytes:(index + 1) * self.slot_bytes]

    def address(self) -> int:
        """The mapping's start address (to tell which slot a buffer occupies)."""
        return int(self._buffer.ctypes.data)

    def copy_in(self, raws: list[torch.Tensor]) -> list[int]:
        """Each chunk's bytes into slots 0, 1, ... (under `lock`); the slots used."""
        for i, raw in enumerate(raws):
            np.copyto(self.slot(i), raw.cpu().numpy())
        return list(range(len(raws)))

    def copy_out(self, found: list[bool], views: list[torch.Tensor]) -> None:
        """Each found chunk out of its slot into its view (CPU or device; under `lock`)."""
        for i, (ok, view) in enumerate(zip(found, views, strict=True)):
            if ok:
                if view.device.type == "cpu":
                    np.copyto(view.numpy(), self.slot(i))
                else:
                    view.copy_(torch.from_numpy(self.slot(i)))

    def unmap(self) -> None:
        del self._buffer
        try:
            self._map.close()
        except BufferError:  # buffers handed out from it are still alive: unmapped once they are freed
            logger.debug("segment %s still has live buffers; unmapped when they go", self.id[:8])
