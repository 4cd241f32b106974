"""Isolated shared memory: one staging segment per client, handed over a unix socket, never by name.

    client: POST /v1/shm/segments {slots}        -> {id, socket, slots, slot_bytes}
            connect(socket); send {"segment": id, "token": <bearer token>}\\n
            <- the segment's file descriptor (SCM_RIGHTS), mmap it
    put:    write chunk i into slot s_i ; POST /v1/shm/segments/put {segment, keys, slots}
            the daemon copies the slots into its own host arena: once answered, the bytes are
            the daemon's and nothing the client writes later changes what anyone reads
    get:    POST /v1/shm/segments/get {segment, keys, slots} -> {found}; the daemon copied each
            found chunk into its slot; the client copies it out

A segment is an anonymous memfd (`os.memfd_create`): it has no name in /dev/shm to guess or open,
exists only in the daemon and in the process that received its descriptor (whose token owns it),
and holds only what that tenant put there or was given. A write past a slot stays inside the
client's own segment (and past its end is a fault in the client), so it cannot reach a chunk of
anyone else. Nothing is leased or reserved in the host tier, so a client that dies leaks nothing
but its segment, which is reclaimed after `idle_s` without use; segments per tenant are capped.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from service.errors import BadRequestError, LeaseLimitError, NotFoundError
from service.tenants import Tenant

logger = logging.getLogger(__name__)

MAX_SEGMENTS_PER_TENANT = 16
_HELLO_LIMIT = 4096


@dataclass(eq=False)
class Segment:
    id: str
    tenant: str
    slots: int
    slot_bytes: int
    fd: int
    view: mmap.mmap
    buffer: torch.Tensor = field(init=False)
    last_used: float = field(default_factory=time.monotonic)
    handed_over: bool = False

    def __post_init__(self) -> None:
        self.buffer = torch.frombuffer(self.view, dtype=torch.uint8)

    def slot(self, index: int) -> torch.Tensor:
        return self.buffer[index * self.slot_bytes:(index + 1) * self.slot_bytes]

    def close(self) -> None:
        del self.buffer
        try:
            self.view.close()
        except BufferError:  # a request still copies through it: the mapping goes when that view does
            logger.debug("segment %s closed while in use; unmapped once the last view is gone", self.id[:8])
        os.close(self.fd)


def check_slots(slots: object, num_keys: int, segment: Segment) -> list[int]:
    """`slots` as distinct in-range slot numbers, one per key; BadRequestError otherwise."""
    if not isinstance(slots, list) or len(slots) != num_keys:
        raise BadRequestError(f"'slots' must be a list of {num_keys} slot numbers, one per key")
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < segment.slots for i in slots):
        raise BadRequestError(f"slot numbers must be integers in [0, {segment.slots}) (this segment's slots)")
    if len(set(slots)) != len(slots):
        raise BadRequestError("slot numbers in one request must be distinct")
    return slots


class SegmentRegistry:
    """The open segments, by unguessable id, each bound to one tenant. Thread-safe."""

    def __init__(self, slot_bytes: int, max_slots: int, idle_s: float) -> None:
        self.slot_bytes, self.max_slots, self.idle_s = slot_bytes, max_slots, idle_s
        self._segments: dict[str, Segment] = {}
        self._lock = threading.Lock()

    def create(self, tenant: Tenant, slots: int) -> Segment:
        if not 1 <= slots <= self.max_slots:
            raise BadRequestError(f"a segment has 1 to {self.max_slots} slots (service.max_batch_chunks), got {slots}")
        with self._lock:
            mine = sum(s.tenant == tenant.name for s in self._segments.values())
            if mine >= MAX_SEGMENTS_PER_TENANT:
                raise LeaseLimitError(f"tenant {tenant.name!r} has {mine} open segments, the most it may; close "
                                      "some (POST /v1/shm/segments/close) or let idle ones expire")
        nbytes = slots * self.slot_bytes
        fd = os.memfd_create(f"kvstore-{tenant.name[:16]}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            view = mmap.mmap(fd, nbytes)
        except BaseException:
            os.close(fd)
            raise
        segment = Segment(secrets.token_hex(16), tenant.name, slots, self.slot_bytes, fd, view)
        with self._lock:
            self._segments[segment.id] = segment
        return segment

    def get(self, segment_id: object, tenant_name: str) -> Segment:
        """The tenant's own segment; NotFoundError for an unknown id or another tenant's."""
        with self._lock:
            segment = self._segments.get(segment_id) if isinstance(segment_id, str) else None
            if segment is None or segment.tenant != tenant_name:
                raise NotFoundError("no open segment with this id for this tenant; create one with "
                                    "POST /v1/shm/segments (idle ones close after "
                                    f"{self.idle_s:g} s)")
            segment.last_used = time.monotonic()
            return segment

    def close(self, segment_id: object, tenant_name: str) -> None:
        segment = self.get(segment_id, tenant_name)
        with self._lock:
            self._segments.pop(segment.id, None)
        segment.close()

    def reap(self) -> int:
        now = time.monotonic()
        with self._lock:
            idle = [s for s in self._segments.values() if now - s.last_used > self.idle_s]
            for s in idle:
                del self._segments[s.id]
        for s in idle:
            s.close()
        return len(idle)

    def count(self, tenant_name: str | None = None) -> int:
        with self._lock:
            return sum(tenant_name in (None, s.tenant) for s in self._segments.values())

    def close_all(self) -> None:
        with self._lock:
            segments, self._segments = list(self._segments.values()), {}
        for s in segments:
            s.close()


class FdServer:
    """A unix socket (mode 0600) that hands a segment's descriptor to a client presenting its id and
    a token of the tenant that owns it; one request per connection."""

    def __init__(self, path: Path, registry: SegmentRegistry, tenant_of: Callable[[str], Tenant | None]) -> None:
        self.path, self.registry, self.tenant_of = path, registry, tenant_of
        path.unlink(missing_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self._sock.bind(str(path))
        finally:
            os.umask(old)
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._serve, name="kv-shm-fds", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(2.0)
                try:
                    self._answer(conn)
                except (OSError, ValueError) as exc:
                    logger.info("shared-memory descriptor request refused: %s", exc)

    def _answer(self, conn: socket.socket) -> None:
        hello = conn.recv(_HELLO_LIMIT)
        request = json.loads(hello.decode())
        if not isinstance(request, dict):
            raise ValueError("the request must be a JSON object")
        tenant = self.tenant_of(str(request.get("token", "")))
        try:
            segment = self.registry.get(request.get("segment"), tenant.name if tenant else "")
        except NotFoundError:
            conn.sendall(b"no such segment for this token\n")
            return
        socket.send_fds(conn, [b"ok\n"], [segment.fd])
        segment.handed_over = True

    def close(self) -> None:
        self._sock.close()
        self.path.unlink(missing_ok=True)
