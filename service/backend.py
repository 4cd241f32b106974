"""`Backend`: the daemon's blocking work on the store, tenant by tenant (always run off the event loop).

Every method takes client keys, maps them through the tenant, enforces its quota, calls the
TieredStore, and maps results back. Puts are acknowledged only once their disk copies exist
(service.durable_puts), so a crash right after an answer loses nothing acknowledged.
"""

from __future__ import annotations

import errno
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from kvstore.errors import LayoutMismatchError, TierIOError
from kvstore.hashing import ChunkKey, TokenIds, as_token_array, chunk_keys, iter_chunk_keys
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.store.levels import Level
from kvstore.types import PutResult
from kvstore.units import format_bytes
from kvstore.wire_types import UNNAMED_MODEL
from service.config import ServiceConfig
from service.errors import ForbiddenError, PayloadTooLargeError
from service.fd_server import FdServer
from service.layouts import ModelLayouts
from service.ledger import Ledger
from service.memory_budget import MemoryBudgets
from service.model_budgets import ModelBudgets
from service.response_buffers import ResponseBuffers
from service.shm_plane import Segment, SegmentRegistry
from service.tenants import Tenant
from tiers.chunk_files import check_writable

logger = logging.getLogger(__name__)
HANDOVER_MIN_S = 10.0  # a segment whose descriptor is not fetched within max(lease_s, this) is reclaimed


def _check_writable(path: str, level: Level) -> None:
    """Refuse a tier this process cannot write, but for a full filesystem under a tier that holds chunks
    (a restart): its puts evict to make room, so the daemon comes up with one warning line instead of
    crash-looping."""
    try:
        check_writable(path, f"the {level.name} tier")
    except TierIOError as exc:
        if exc.errno != errno.ENOSPC or not level.tier.used_bytes:
            raise
        logger.warning("%s; starting anyway: the tier holds %s and evicts from it to make room for new chunks",
                       exc, format_bytes(level.tier.used_bytes))


class Backend:
    """The store plus tenants, quotas and the shared-memory segments."""

    def __init__(self, store: TieredStore, config: ServiceConfig, tenants: list[Tenant] | None = None) -> None:
        self.store = store
        self.config = config
        for level in store.levels:  # a daemon refuses to start on a tier it cannot write
            if level.config.path and not level.tier.is_memory:
                _check_writable(level.config.path, level)
        self.ledger = Ledger(store, tenants or [])
        self.ledger.rebuild()
        self.layout = store.layout  # the default layout: a client that registers none (kvstore/store/layouts.py)
        self.layouts = ModelLayouts(store)
        self.model_budgets = ModelBudgets(store, config.model_budgets)
        self.has_disk = any(not level.tier.is_memory for level in store.levels)
        # A lookup touches only the in-memory index unless a shared (PFS, Redis) level must be checked for
        # chunks other nodes wrote; only then does it need a thread.
        self.lookup_is_memory_only = all(not level.tier.is_shared for level in store.levels)
        self.segments: SegmentRegistry | None = None
        self.fd_socket: Path | None = None
        self._fd_server: FdServer | None = None
        self.instance_id = secrets.token_hex(8)  # this daemon process (a restarted daemon has another)
        self.response_buffers = ResponseBuffers(max_free_bytes=2 * config.max_body_bytes)
        self.memory = MemoryBudgets(config.tenant_memory_bytes, {t.name: t.memory_bytes for t in config.tenants
                                                                 if t.memory_bytes is not None})

    @property
    def shm_plane(self) -> str | None:
        """"segments", or None (no shared memory)."""
        return "segments" if self.segments is not None else None

    def open_segments(self, tenant_of: Callable[[str], Tenant | None], socket_path: Path) -> None:
        """Serve per-client segments, their descriptors handed out on `socket_path`."""
        config = self.config
        self.segments = SegmentRegistry(config.max_batch_chunks, idle_s=10 * config.lease_s, budgets=self.memory,
                                        handover_s=max(config.lease_s, HANDOVER_MIN_S))
        self.fd_socket = socket_path
        self._fd_server = FdServer(socket_path, self.segments, tenant_of, deadline_s=config.shm_socket_deadline_s,
                                   max_per_peer=config.shm_socket_max_per_peer,
                                   max_connections=config.shm_socket_max_connections)

    def close_segments(self) -> None:
        if self._fd_server is not None:
            self._fd_server.close()
        if self.segments is not None:
            self.segments.close_all()

    def reap_segments(self) -> int:
        """Close the segments of clients that exited, of descriptors never fetched, and idle ones (cheap:
        no store call, so it runs even while a stalled backend holds the I/O threads)."""
        return self.segments.reap() if self.segments is not None else 0

    def tenant_memory(self, tenant: Tenant) -> dict[str, int]:
        """The tenant's memory budget, what is charged to it now, and its open segments."""
        return {"memory_bytes": self.memory.used(tenant.name), "memory_limit_bytes": self.memory.limit(tenant.name),
                "segments": self.segments.count(tenant.name) if self.segments is not None else 0}

    def check_batch(self, num_chunks: int) -> None:
        if num_chunks > self.config.max_batch_chunks:
            raise PayloadTooLargeError(f"{num_chunks} chunks in one request; the limit is "
                                       f"{self.config.max_batch_chunks} (service.max_batch_chunks): split the batch")

    # ----- lookup ----------------------------------------------------------------------------
    def lookup_tokens(self, tenant: Tenant, token_ids: TokenIds, layout: KVLayout,
                      local_only: bool = False) -> list[ChunkKey]:
        """Client keys of the leading cached chunks of a prompt, in chunks of `layout`'s tokens (hashing stops at
        the first miss). `local_only`: ask this node's index only, never a shared tier."""
        chunk_tokens = layout.chunk_tokens
        walk = (tenant.map_key(k) for k in iter_chunk_keys(token_ids, tenant.root_key, chunk_tokens))
        num_hits = self._held(walk) if local_only else self.store.lookup_keys(walk)
        hits = chunk_keys(as_token_array(token_ids)[: num_hits * chunk_tokens], tenant.root_key, chunk_tokens)
        tenant.touch(tenant.map_keys(hits))
        return hits

    def lookup_keys(self, tenant: Tenant, keys: Sequence[ChunkKey], local_only: bool = False) -> int:
        self.check_batch(len(keys))
        mapped = tenant.map_keys(keys)
        num_hits = self._held(mapped) if local_only else self.store.lookup_keys(mapped)
        tenant.touch(mapped[:num_hits])
        return num_hits

    def _held(self, store_keys: Iterable[ChunkKey]) -> int:
        hits = 0
        for key in store_keys:
            if not self.store.holds(key):
                break
            hits += 1
        return hits

    # ----- put / get / remove -----------------------------------------------------------------
    def put_many(self, tenant: Tenant, keys: Sequence[ChunkKey], data: bytes | bytearray | memoryview,
                 layout: KVLayout, model: str = UNNAMED_MODEL) -> PutResult:
        """Store `len(keys)` raw chunks of `layout` laid end to end in `data` (`model`'s, for its budget)."""
        self.check_batch(len(keys))
        n = layout.chunk_bytes
        if len(data) != len(keys) * n:
            raise LayoutMismatchError(
                f"body has {len(data)} bytes for {len(keys)} chunks; each chunk is {n} bytes "
                f"(layout {layout.chunk_shape} {layout.dtype})")
        with self.memory.hold(tenant.name, len(data), f"a put of {len(keys)} chunks over HTTP"):
            buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if keys else torch.empty(0, dtype=torch.uint8)
            chunks = [_as_chunk(buffer[i * n:(i + 1) * n], layout) for i in range(len(keys))]
            return self.put_chunks(tenant, keys, chunks, model)

    def put_chunks(self, tenant: Tenant, keys: Sequence[ChunkKey], chunks: Sequence[torch.Tensor],
                   model: str = UNNAMED_MODEL) -> PutResult:
        """Store chunks of one layout (copied into the store's own tiers before this returns)."""
        self.check_batch(len(keys))
        mapped = tenant.map_keys(keys)
        chunk_bytes = chunks[0].nbytes if chunks else 0
        started = time.monotonic()
        self.enforce_quota(tenant, mapped, chunk_bytes, model)
        try:
            result = self.store.put_many(mapped, chunks)
        finally:
            self._settle(tenant, model, mapped, chunk_bytes)
        return self._finish_put(tenant, model, keys, mapped, result, started, chunk_bytes)

    def enforce_quota(self, tenant: Tenant, mapped: list[ChunkKey], chunk_bytes: int,
                      model: str = UNNAMED_MODEL) -> None:
        """Charge the tenant and the model's budget for `mapped` (`chunk_bytes` each) now and remove their own
        chunks for room."""
        victims = self.ledger.charge(tenant, mapped, chunk_bytes)
        victims += self.model_budgets.charge(model, mapped, chunk_bytes)
        for victim in dict.fromkeys(victims):
            self.store.remove(victim)

    def _settle(self, tenant: Tenant, model: str, mapped: list[ChunkKey], chunk_bytes: int) -> None:
        self.ledger.settle(tenant, mapped, chunk_bytes)
        self.model_budgets.settle(model, mapped, chunk_bytes)

    def _finish_put(self, tenant: Tenant, model: str, keys: Sequence[ChunkKey], mapped: list[ChunkKey],
                    result: PutResult, started: float, chunk_bytes: int) -> PutResult:
        self._wait_durable(result, started)
        self._settle(tenant, model, mapped, chunk_bytes)
        back = dict(zip(mapped, keys, strict=True))
        return PutResult(stored=[back[k] for k in result.stored],
                         not_stored={back[k]: v for k, v in result.not_stored.items()},
                         not_replicated={back[k]: v for k, v in result.not_replicated.items()})

    def _wait_durable(self, result: PutResult, started: float) -> None:
        """Wait for the disk copies until the put's own deadline (started + put_timeout_s); name the
        cause of what is still not on disk (a failed write's errno, else the busy queues)."""
        if not (self.config.durable_puts and result.stored):
            return
        if not any(level.tier.is_durable for level in self.store.levels):
            if self.has_disk:  # a replica tier that declared no durability (e.g. Redis without AOF/RDB)
                reason = ("no durable copy: this daemon's lower tiers do not persist (memory, or Redis without "
                          "AOF/RDB persistence); enable appendonly on Redis or add an NVMe tier")
                for key in result.stored:
                    result.not_replicated.setdefault(key, reason)
            return
        timeout_s = self.store.config.put_timeout_s
        missing = self.store.wait_durable(result.stored, timeout_s=max(0.0, started + timeout_s - time.monotonic()))
        if not missing:
            return
        failures = self.store.write_errors.since(started)
        reason = "; ".join(failures) if failures else f"disk copy not confirmed within {timeout_s:g} s (write queues busy)"
        for key in missing:
            result.not_replicated.setdefault(key, reason)

    def fd_socket_stats(self) -> dict[str, int]:
        return self._fd_server.stats() if self._fd_server is not None else {}

    def error_counts(self) -> dict[str, int]:
        """Failed disk writes and reads by tier and cause, e.g. {"nvme.write_errors_ENOSPC": 3}."""
        counters = self.store.stats_counters.snapshot()
        return {k: v for k, v in counters.items() if ".write_errors_" in k or k.endswith(".read_errors")}

    def get_many(self, tenant: Tenant, keys: Sequence[ChunkKey], model: str, layout: KVLayout) -> tuple[list[bool], torch.Tensor]:
        """(found flags, one uint8 buffer holding every chunk of `layout` in order; missed chunks are garbage).
        The buffer comes from `response_buffers`: give it back once the answer is sent."""
        self.check_batch(len(keys))
        n = layout.chunk_bytes
        with self.memory.hold(tenant.name, len(keys) * n, f"a get of {len(keys)} chunks over HTTP"):
            buffer = self.response_buffers.take(len(keys) * n)
            outs = [_as_chunk(buffer[i * n:(i + 1) * n], layout) for i in range(len(keys))]
            return self._get(tenant, keys, outs, model), buffer

    def _get(self, tenant: Tenant, keys: Sequence[ChunkKey], outs: list[torch.Tensor], model: str) -> list[bool]:
        """Read `keys` into `outs`; the tenant's per-model counters learn which tier served each."""
        mapped = tenant.map_keys(keys)
        served = self.store.get_many_served(mapped, outs) if keys else []
        tenant.models.count_get(model, served, outs[0].nbytes if outs else 0)
        tenant.touch(k for k, tier in zip(mapped, served, strict=True) if tier is not None)
        return [tier is not None for tier in served]

    def remove(self, tenant: Tenant, key: ChunkKey) -> bool:
        mapped = tenant.map_key(key)
        try:
            return self.store.remove(mapped)
        finally:
            self.ledger.settle(tenant, [mapped], 0)  # gone: forgotten whatever its size

    # ----- isolated shared-memory plane: per-client segments (service/shm_plane.py) -------------
    def check_segments(self, tenant: Tenant) -> SegmentRegistry:
        """The segment registry, if this tenant may use it; ForbiddenError otherwise."""
        if self.segments is None or not tenant.shm:
            raise ForbiddenError(f"tenant {tenant.name!r} may not use shared memory here (service.shm and the "
                                 "tenant's shm = true); use the HTTP chunk routes")
        return self.segments

    def put_segment(self, tenant: Tenant, segment: Segment, keys: Sequence[ChunkKey], slots: list[int],
                    model: str = UNNAMED_MODEL) -> PutResult:
        """Copy the chunks out of the client's slots into the store: afterwards they are the daemon's bytes."""
        return self.put_chunks(tenant, keys, [segment.slot(s) for s in slots], model)

    def get_segment(self, tenant: Tenant, segment: Segment, keys: Sequence[ChunkKey], slots: list[int],
                    model: str = UNNAMED_MODEL) -> list[bool]:
        self.check_batch(len(keys))
        return self._get(tenant, keys, [segment.slot(s) for s in slots], model)


def _as_chunk(raw: torch.Tensor, layout: KVLayout) -> torch.Tensor:
    return raw.view(layout.torch_dtype).view(layout.chunk_shape)
