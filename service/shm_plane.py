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
but its segment. A segment is reclaimed at the first reaper round (about a second) after the process
that received its descriptor exits (a pidfd of that peer, taken from SO_PEERCRED at hand-over), when
its descriptor is not fetched within `handover_s`, or after `idle_s` without use. Its bytes are
charged to the tenant's memory budget while it is open (service/memory_budget.py), and segments
per tenant are capped. The descriptor is handed over once; service/fd_server.py serves the socket.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
import select
import threading
import time
from dataclasses import dataclass, field

import torch

from kvstore.layout import KVLayout
from kvstore.units import format_bytes
from service.errors import BadRequestError, LeaseLimitError, NotFoundError
from service.memory_budget import MemoryBudgets
from service.tenants import Tenant

logger = logging.getLogger(__name__)

MAX_SEGMENTS_PER_TENANT = 16


@dataclass(eq=False)
class Segment:
    id: str
    tenant: str
    slots: int
    layout: KVLayout  # every slot holds one chunk of it
    fd: int
    view: mmap.mmap
    buffer: torch.Tensor = field(init=False)
    last_used: float = field(default_factory=time.monotonic)
    created: float = field(default_factory=time.monotonic)
    handed_over: bool = False
    peer_pidfd: int | None = None  # the process that received the descriptor (None: not yet, or unknown)

    def __post_init__(self) -> None:
        self.buffer = torch.frombuffer(self.view, dtype=torch.uint8)

    @property
    def slot_bytes(self) -> int:
        return self.layout.chunk_bytes

    def slot(self, index: int) -> torch.Tensor:
        """Slot `index` as a chunk of the segment's layout (a view of the client's memory)."""
        raw = self.buffer[index * self.slot_bytes:(index + 1) * self.slot_bytes]
        return raw.view(self.layout.torch_dtype).view(self.layout.chunk_shape)

    @property
    def nbytes(self) -> int:
        return self.slots * self.slot_bytes

    def peer_exited(self) -> bool:
        """The process that received the descriptor has exited (its pidfd is readable)."""
        if self.peer_pidfd is None:
            return False
        poller = select.poll()  # not select(): a descriptor number may be past FD_SETSIZE
        poller.register(self.peer_pidfd, select.POLLIN)
        return bool(poller.poll(0))

    def close(self) -> None:
        if self.peer_pidfd is not None:
            os.close(self.peer_pidfd)
            self.peer_pidfd = None
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
    """The open segments, by unguessable id, each bound to one tenant and one layout (its slots' chunk shape)
    and charged to the tenant's memory budget. Thread-safe."""

    def __init__(self, max_slots: int, idle_s: float, *, budgets: MemoryBudgets, handover_s: float) -> None:
        self.max_slots, self.idle_s, self.handover_s = max_slots, idle_s, handover_s
        self.budgets = budgets
        self._segments: dict[str, Segment] = {}
        self._lock = threading.Lock()

    def create(self, tenant: Tenant, slots: int, layout: KVLayout) -> Segment:
        """A new segment of `slots` chunk slots of `layout`, charged to the tenant's memory budget.

        Raises:
            BadRequestError: `slots` out of range.
            LeaseLimitError, MemoryBudgetError (429): the tenant holds its cap of segments, or the
                segment's bytes do not fit its memory budget.
        """
        if not 1 <= slots <= self.max_slots:
            raise BadRequestError(f"a segment has 1 to {self.max_slots} slots (service.max_batch_chunks), got {slots}")
        nbytes = slots * layout.chunk_bytes
        with self._lock:
            mine = sum(s.tenant == tenant.name for s in self._segments.values())
            if mine >= MAX_SEGMENTS_PER_TENANT:
                raise LeaseLimitError(f"tenant {tenant.name!r} has {mine} open segments, the most it may; close "
                                      "some (POST /v1/shm/segments/close) or let idle ones expire")
            self.budgets.charge(tenant.name, nbytes, f"a {slots}-slot segment ({format_bytes(nbytes)})")
        try:
            segment = self._map(tenant.name, slots, layout)
        except BaseException:
            self.budgets.release(tenant.name, nbytes)
            raise
        with self._lock:
            self._segments[segment.id] = segment
        return segment

    def _map(self, tenant_name: str, slots: int, layout: KVLayout) -> Segment:
        nbytes = slots * layout.chunk_bytes
        fd = os.memfd_create(f"kvstore-{tenant_name[:16]}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            view = mmap.mmap(fd, nbytes)
        except BaseException:
            os.close(fd)
            raise
        return Segment(secrets.token_hex(16), tenant_name, slots, layout, fd, view)

    def get(self, segment_id: object, tenant_name: str) -> Segment:
        """The tenant's own segment; NotFoundError for an unknown id or another tenant's."""
        with self._lock:
            segment = self._segments.get(segment_id) if isinstance(segment_id, str) else None
            if segment is None or segment.tenant != tenant_name:
                raise NotFoundError("no open segment with this id for this tenant; create one with "
                                    "POST /v1/shm/segments (idle ones close after "
                                    f"{self.idle_s:g} s, and when the client process exits)")
            segment.last_used = time.monotonic()
            return segment

    def hand_over(self, segment_id: object, tenant_name: str, peer_pid: int) -> int:
        """The segment's descriptor for the process `peer_pid` (SO_PEERCRED), once: that process is then
        its owner, and the segment is reclaimed when it exits. NotFoundError otherwise."""
        segment = self.get(segment_id, tenant_name)
        with self._lock:
            if segment.handed_over:
                raise NotFoundError("this segment's descriptor was handed over already; create a new segment")
            segment.handed_over = True
            segment.peer_pidfd = _pidfd(peer_pid)
        return segment.fd

    def close(self, segment_id: object, tenant_name: str) -> None:
        segment = self.get(segment_id, tenant_name)
        with self._lock:
            if self._segments.pop(segment.id, None) is None:
                return
        self._dispose(segment)

    def _dispose(self, segment: Segment) -> None:
        segment.close()
        self.budgets.release(segment.tenant, segment.nbytes)

    def _expired(self, segment: Segment, now: float) -> bool:
        if now - segment.last_used > self.idle_s:
            return True
        if not segment.handed_over:
            return now - segment.created > self.handover_s
        return segment.peer_exited()

    def reap(self) -> int:
        """Close idle segments, segments whose descriptor was not fetched in time, and segments whose
        client process exited. Returns how many closed."""
        now = time.monotonic()
        with self._lock:
            gone = [s for s in self._segments.values() if self._expired(s, now)]
            for s in gone:
                del self._segments[s.id]
        for s in gone:
            self._dispose(s)
        if gone:
            logger.info("reclaimed %d shared-memory segments (client gone, idle, or never fetched)", len(gone))
        return len(gone)

    def count(self, tenant_name: str | None = None) -> int:
        with self._lock:
            return sum(tenant_name in (None, s.tenant) for s in self._segments.values())

    def close_all(self) -> None:
        with self._lock:
            segments, self._segments = list(self._segments.values()), {}
        for s in segments:
            self._dispose(s)


def _pidfd(pid: int) -> int | None:
    """A pidfd of `pid` (readable once it exits; immune to pid reuse), None when it cannot be had
    (pid 0: a peer in another pid namespace; a kernel before 5.3)."""
    if pid <= 0 or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError as exc:
        logger.info("cannot watch shared-memory client pid %d (%s): its segments close when idle", pid, exc)
        return None
