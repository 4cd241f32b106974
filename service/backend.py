"""`Backend`: the daemon's blocking work on the store, tenant by tenant (always run off the event loop).

Every method takes client keys, maps them through the tenant, enforces its quota, calls the
TieredStore, and maps results back. Puts are acknowledged only once their disk copies exist
(service.durable_puts), so a crash right after an answer loses nothing acknowledged.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from typing import Any

import torch

from kvstore.errors import ConfigError, LayoutMismatchError
from kvstore.hashing import ChunkKey, as_token_array, chunk_keys, iter_chunk_keys
from kvstore.store import TieredStore
from kvstore.types import PutResult
from service.config import ServiceConfig
from service.errors import ForbiddenError, PayloadTooLargeError
from service.leases import GrantKind, GrantTable
from service.response_buffers import ResponseBuffers
from service.tenants import Tenant

logger = logging.getLogger(__name__)


class Backend:
    """The store plus tenants, quotas and shared-memory grants."""

    def __init__(self, store: TieredStore, config: ServiceConfig) -> None:
        self.store = store
        self.config = config
        self.layout = store.layout
        self.chunk_bytes = store.layout.chunk_bytes
        self.grants = GrantTable(config.lease_s)
        self.has_disk = any(not level.tier.is_memory for level in store.levels)
        # A lookup touches only the in-memory index unless a shared level (PFS, Redis) must be asked
        # for chunks other nodes wrote; only then does it need a thread.
        self.lookup_is_memory_only = not any(level.tier.is_shared for level in store.levels)
        self.shm_name = self._shm_name()
        self.instance_id = secrets.token_hex(8)  # a client maps the segment again when this changes
        self.response_buffers = ResponseBuffers(max_free_bytes=2 * config.max_body_bytes)

    def _shm_name(self) -> str | None:
        try:
            return self.store.host_shm_name
        except ConfigError as exc:
            logger.warning("shared-memory data plane off: %s", exc)
            return None

    def check_batch(self, num_chunks: int) -> None:
        if num_chunks > self.config.max_batch_chunks:
            raise PayloadTooLargeError(f"{num_chunks} chunks in one request; the limit is "
                                       f"{self.config.max_batch_chunks} (service.max_batch_chunks): split the batch")

    # ----- lookup ----------------------------------------------------------------------------
    def lookup_tokens(self, tenant: Tenant, token_ids: Any) -> list[ChunkKey]:
        """Client keys of the leading cached chunks of a prompt (hashing stops at the first miss)."""
        chunk_tokens = self.layout.chunk_tokens
        walk = (tenant.map_key(k) for k in iter_chunk_keys(token_ids, tenant.root_key, chunk_tokens))
        num_hits = self.store.lookup_keys(walk)
        hits = chunk_keys(as_token_array(token_ids)[: num_hits * chunk_tokens], tenant.root_key, chunk_tokens)
        tenant.touch(tenant.map_keys(hits))
        return hits

    def lookup_keys(self, tenant: Tenant, keys: Sequence[ChunkKey]) -> int:
        self.check_batch(len(keys))
        num_hits = self.store.lookup_keys(tenant.map_keys(keys))
        tenant.touch(tenant.map_keys(keys[:num_hits]))
        return num_hits

    # ----- put / get / remove -----------------------------------------------------------------
    def put_many(self, tenant: Tenant, keys: Sequence[ChunkKey], data: bytes | bytearray | memoryview) -> PutResult:
        """Store `len(keys)` raw chunks laid end to end in `data`."""
        self.check_batch(len(keys))
        if len(data) != len(keys) * self.chunk_bytes:
            raise LayoutMismatchError(
                f"body has {len(data)} bytes for {len(keys)} chunks; each chunk is {self.chunk_bytes} bytes "
                f"(layout {self.layout.chunk_shape} {self.layout.dtype})")
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if keys else torch.empty(0, dtype=torch.uint8)
        chunks = [buffer[i * self.chunk_bytes:(i + 1) * self.chunk_bytes].view(self.layout.torch_dtype)
                  .view(self.layout.chunk_shape) for i in range(len(keys))]
        mapped = tenant.map_keys(keys)
        self._enforce_quota(tenant, mapped)
        result = self.store.put_many(mapped, chunks)
        return self._finish_put(tenant, keys, mapped, result)

    def _enforce_quota(self, tenant: Tenant, mapped: list[ChunkKey]) -> None:
        for victim in tenant.admit(mapped, self.chunk_bytes):
            self.store.remove(victim)

    def _finish_put(self, tenant: Tenant, keys: Sequence[ChunkKey], mapped: list[ChunkKey],
                    result: PutResult) -> PutResult:
        self._wait_durable(result)
        tenant.record(result.stored, self.chunk_bytes)
        back = dict(zip(mapped, keys, strict=True))
        return PutResult(stored=[back[k] for k in result.stored],
                         not_stored={back[k]: v for k, v in result.not_stored.items()},
                         not_replicated={back[k]: v for k, v in result.not_replicated.items()})

    def _wait_durable(self, result: PutResult) -> None:
        if not (self.config.durable_puts and self.has_disk and result.stored):
            return
        timeout_s = self.store.config.put_timeout_s
        reason = f"disk copy not confirmed within {timeout_s:g} s (write queues busy)"
        for key in self.store.wait_durable(result.stored, timeout_s=timeout_s):
            result.not_replicated.setdefault(key, reason)

    def get_many(self, tenant: Tenant, keys: Sequence[ChunkKey]) -> tuple[list[bool], torch.Tensor]:
        """(found flags, one uint8 buffer holding every chunk in order; missed chunks are garbage).
        The buffer comes from `response_buffers`: give it back once the answer is sent."""
        self.check_batch(len(keys))
        buffer = self.response_buffers.take(len(keys) * self.chunk_bytes)
        outs = [buffer[i * self.chunk_bytes:(i + 1) * self.chunk_bytes].view(self.layout.torch_dtype)
                .view(self.layout.chunk_shape) for i in range(len(keys))]
        mapped = tenant.map_keys(keys)
        found = self.store.get_many(mapped, outs) if keys else []
        tenant.touch(k for k, ok in zip(mapped, found, strict=True) if ok)
        return found, buffer

    def remove(self, tenant: Tenant, key: ChunkKey) -> bool:
        mapped = tenant.map_key(key)
        tenant.forget([mapped])
        return self.store.remove(mapped)

    # ----- shared-memory data plane -----------------------------------------------------------
    def _check_shm(self, tenant: Tenant) -> None:
        if self.shm_name is None:
            raise ForbiddenError("this daemon's host tier is not in shared memory (service.shm = false); use the "
                                 "HTTP chunk routes")
        if not tenant.shm:
            raise ForbiddenError(f"tenant {tenant.name!r} may not use the shared-memory plane; set shm = true for it "
                                 "in [[service.tenants]] or use the HTTP chunk routes")

    def reserve(self, tenant: Tenant, keys: Sequence[ChunkKey]) -> list[tuple[str, int, int]]:
        """(grant id, offset, nbytes) per key; all or nothing."""
        self._check_shm(tenant)
        self.check_batch(len(keys))
        mapped = tenant.map_keys(keys)
        self._enforce_quota(tenant, mapped)
        grants: list[tuple[str, int, int]] = []
        try:
            for key, mapped_key in zip(keys, mapped, strict=True):
                res = self.store.reserve(mapped_key)
                grant_id = self.grants.add(GrantKind.RESERVATION, tenant.name, (res, mapped_key, key))
                grants.append((grant_id, res.offset, res.nbytes))
        except BaseException:
            self.abort(tenant, [g[0] for g in grants])
            raise
        return grants

    def commit(self, tenant: Tenant, grant_ids: Sequence[str]) -> PutResult:
        """Publish reserved slots the client has filled; answers with client keys."""
        self.check_batch(len(grant_ids))
        handles = [self.grants.take(gid, GrantKind.RESERVATION, tenant.name) for gid in grant_ids]
        result = PutResult()
        for i, (reservation, _, _) in enumerate(handles):
            try:
                part = self.store.commit(reservation)
            except BaseException:
                for later, _, _ in handles[i + 1:]:  # never leak the slots not yet published
                    self.store.abort(later)
                raise
            result.stored += part.stored
            result.not_stored.update(part.not_stored)
            result.not_replicated.update(part.not_replicated)
        return self._finish_put(tenant, [h[2] for h in handles], [h[1] for h in handles], result)

    def abort(self, tenant: Tenant, grant_ids: Sequence[str]) -> None:
        for gid in grant_ids:
            self.store.abort(self.grants.take(gid, GrantKind.RESERVATION, tenant.name)[0])

    def acquire(self, tenant: Tenant, keys: Sequence[ChunkKey]) -> list[tuple[str, int, int] | None]:
        """(grant id, offset, nbytes) per key, None on a miss; on an error no lease stays open."""
        self._check_shm(tenant)
        self.check_batch(len(keys))
        leases: list[tuple[str, int, int] | None] = []
        try:
            for key in tenant.map_keys(keys):
                lease = self.store.acquire(key)
                leases.append(None if lease is None else
                              (self.grants.add(GrantKind.LEASE, tenant.name, lease), lease.offset, lease.nbytes))
        except BaseException:
            self.release(tenant, [g[0] for g in leases if g is not None])
            raise
        return leases

    def release(self, tenant: Tenant, grant_ids: Sequence[str]) -> None:
        self.check_batch(len(grant_ids))
        for gid in grant_ids:
            self.store.release(self.grants.take(gid, GrantKind.LEASE, tenant.name))

    def reap(self, grants: Sequence[Any] | None = None) -> int:
        """Release leases and abort reservations whose clients let them expire (or all, at shutdown)."""
        grants = self.grants.expired() if grants is None else grants
        for grant in grants:
            if grant.kind is GrantKind.LEASE:
                self.store.release(grant.handle)
            else:
                self.store.abort(grant.handle[0])
        return len(grants)
