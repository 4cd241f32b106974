"""`RedisTier`: chunks as Redis string values (standalone Redis or Redis Cluster), shared by every node.

    value of  PREFIX:chunk:<key hex>  =  | chunk header (64 B, kvstore/chunk_format.py) | payload |

The header and both checksums are the disk tiers' (no 4 KiB padding: nothing here does O_DIRECT),
so a reader verifies every byte it returns and a corrupt value is a miss that is deleted. Keys carry
no hash tag, so on Redis Cluster chunks spread over all slots. Batches are pipelined.

Like the PFS tier, the bytes are shared: `meta`/`get_into` ask Redis, so another node's chunk is a
hit here. `used_bytes` is this process's view (what it wrote, read or listed with `keys()`); size
`capacity_bytes` as this node's share. Redis's own `maxmemory` refusals surface as TierFullError.

When Redis is down, calls raise TierIOError (the store treats reads as misses and writes as not
stored), and for `retry_after_s` after a connection failure they fail at once instead of waiting
on connect timeouts again, so a dead Redis costs the hot path nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import redis
import torch

from kvstore.chunk_format import HEADER_BYTES, ChunkHeader, verify_payload
from kvstore.errors import BadChunkError, ConfigError, CorruptChunkError, TierFullError, TierIOError
from kvstore.hashing import validate_key
from kvstore.redact import redact_url
from kvstore.types import ChunkMeta, TierKind
from tiers.base import Tier, check_out, check_payload
from tiers.redis_durability import PersistenceProbe
from tiers.redis_ledger import RedisLedger, footprint
from tiers.redis_reader import RespReader
from tiers.redis_support import KeyLocks, RedisCalls, StagingBuffer, batches, make_client, scan_headers
from tiers.redis_values import DELETE_IF_HEADER, copy_payload, fill_value, header_of, key_of_name, meta_of
from tiers.registry import register_tier

logger = logging.getLogger(__name__)

DEFAULT_MAX_VALUE_BYTES = 512 << 20  # Redis's default proto-max-bulk-len


@register_tier
class RedisTier(Tier):
    """Chunks as Redis values.

    Args:
        capacity_bytes: this node's budget in Redis (see the module docstring on `used_bytes`).
        url: redis://host:port/db (or rediss://, unix://).
        prefix: key prefix separating deployments; chunk keys are already per model and tenant.
        cluster: talk to a Redis Cluster (redis.cluster.RedisCluster) instead of one server.
        num_workers: threads behind submit_put/submit_get.
        socket_timeout_s / connect_timeout_s: a slower Redis counts as down (TierIOError).
        retry_after_s: after a connection failure, fail at once for this long.
        pipeline_bytes: most value bytes sent in one pipeline by put_many/get_many.
        client: an existing redis-py client (tests, shared pools); url/cluster/timeouts are then unused.
    """

    kind = TierKind.REDIS
    is_shared = True

    def __init__(self, *, capacity_bytes: int, url: str = "redis://127.0.0.1:6379/0", prefix: str = "kvstore",
                 cluster: bool = False, num_workers: int = 4, socket_timeout_s: float = 5.0,
                 connect_timeout_s: float = 1.0, retry_after_s: float = 1.0, pipeline_bytes: int = 256 << 20,
                 client: Any = None) -> None:
        super().__init__(capacity_bytes=capacity_bytes)
        if num_workers < 1 or pipeline_bytes < 1 or retry_after_s < 0:
            raise ConfigError(f"RedisTier: num_workers ({num_workers}) and pipeline_bytes ({pipeline_bytes}) must be "
                              f">= 1 and retry_after_s ({retry_after_s}) >= 0")
        self.url, self.prefix, self.pipeline_bytes = redact_url(url), prefix, pipeline_bytes  # for messages
        self.client = client if client is not None else make_client(url, cluster=cluster, socket_timeout_s=socket_timeout_s,
                                                                    connect_timeout_s=connect_timeout_s)
        self._call = RedisCalls(self.url, retry_after_s).call  # one Redis call, its failures as TierIOError/TierFullError
        self._delete_if_header = self.client.register_script(DELETE_IF_HEADER)
        self._lock = threading.Lock()
        self._ledger = RedisLedger(capacity_bytes)
        self._max_value_bytes: int | None = None
        self._staging = StagingBuffer()
        self._key_locks = KeyLocks()  # this process's writes of one key land in Redis and the index in one order
        self.num_corrupt_dropped = 0
        self._pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="redis-io")
        # GETs into the caller's buffers on raw sockets (plain single-server clients we built ourselves)
        self._reader = RespReader(self.client.connection_pool.connection_kwargs, socket_timeout_s) \
            if client is None and RespReader.supports(self.client) else None
        self._persistence = PersistenceProbe(self.client, self.url)
        logger.info("Redis tier at %s (prefix %r%s)", self.url, prefix, ", cluster" if cluster else "")

    @property
    def is_durable(self) -> bool:
        """Only a Redis that persists (AOF, or RDB snapshots) keeps a copy across its own restart
        (tiers/redis_durability.py; unknown = not durable)."""
        return self._persistence.is_durable

    # ---- names, accounting ------------------------------------------------------------------
    def redis_key(self, key: bytes) -> str:
        return f"{self.prefix}:chunk:{key.hex()}"

    @property
    def used_bytes(self) -> int:
        return self._ledger.used_bytes

    def footprint(self, stored_bytes: int) -> int:
        return footprint(stored_bytes)

    # ---- Redis calls --------------------------------------------------------------------------
    def max_value_bytes(self) -> int:
        """Largest value Redis accepts (proto-max-bulk-len), asked once; the default where CONFIG is disabled."""
        if self._max_value_bytes is None:
            try:
                found = self._call(self.client.config_get, "proto-max-bulk-len")
                self._max_value_bytes = int(next(iter(found.values()))) if found else DEFAULT_MAX_VALUE_BYTES
            except TierIOError:
                self._max_value_bytes = DEFAULT_MAX_VALUE_BYTES
        return self._max_value_bytes

    # ---- put ----------------------------------------------------------------------------------
    def _encode(self, key: bytes, payload: torch.Tensor, meta: ChunkMeta, *, staged: bool = False) -> memoryview:
        """The value for one chunk: header + payload, in this thread's reusable buffer when `staged`
        (a fresh 32 MiB allocation per put costs as much as sending it), else in new memory."""
        key = validate_key(key)
        check_payload(payload)
        if meta.stored_bytes != payload.numel():
            raise BadChunkError(f"meta.stored_bytes is {meta.stored_bytes} but the payload has {payload.numel()} bytes")
        nbytes = self.footprint(payload.numel())
        if nbytes > self.max_value_bytes():
            raise TierFullError(f"a {nbytes}-byte chunk value exceeds Redis's proto-max-bulk-len of "
                                f"{self.max_value_bytes()} bytes; raise it (CONFIG SET proto-max-bulk-len) "
                                "or use smaller chunk_tokens")
        value = self._staging.get(nbytes) if staged else np.empty(nbytes, dtype=np.uint8)
        return fill_value(value, key, payload.cpu().numpy(), meta)

    def put(self, key: bytes, payload: torch.Tensor, meta: ChunkMeta) -> None:
        self.put_many([(key, payload, meta)])

    def put_many(self, items: Sequence[tuple[bytes, torch.Tensor, ChunkMeta]]) -> None:
        """Pipelined SETs (at most `pipeline_bytes` per round trip); all reserved before any is sent."""
        values = [self._encode(key, payload, meta, staged=len(items) == 1) for key, payload, meta in items]
        reserved = []
        try:
            for (key, _, _), value in zip(items, values, strict=True):
                self._ledger.reserve(key, len(value))
                reserved.append(len(value))
            for start, stop in batches([len(v) for v in values], self.pipeline_bytes):
                with self._key_locks.holding([key for key, _, _ in items[start:stop]]):
                    pipe = self.client.pipeline(transaction=False)
                    for (key, _, _), value in zip(items[start:stop], values[start:stop], strict=True):
                        pipe.set(self.redis_key(key), value)
                    self._call(pipe.execute)
                    for key, _, meta in items[start:stop]:
                        self._ledger.record(key, meta)
        finally:
            self._ledger.unreserve(sum(reserved))

    # ---- get ----------------------------------------------------------------------------------
    def get_into(self, key: bytes, out: torch.Tensor) -> int | None:
        return self.get_many([key], [out])[0]

    def get_many(self, keys: Sequence[bytes], outs: Sequence[torch.Tensor]) -> list[int | None]:
        """Pipelined GETs; every value is checked and copied; the first error is raised after all are done."""
        keys = [validate_key(key) for key in keys]
        results: list[int | None] = []
        first_error: Exception | None = None
        group = max(1, self.pipeline_bytes // max(1, max((out.numel() for out in outs), default=1)))
        for start in range(0, len(keys), group):
            part_keys, part_outs = keys[start:start + group], outs[start:start + group]
            if self._reader is not None and all(out.device.type == "cpu" for out in part_outs):
                with self._key_locks.holding(part_keys):
                    first_error = self._get_direct(part_keys, part_outs, results) or first_error
                continue
            with self._key_locks.holding(keys[start:start + group]):
                pipe = self.client.pipeline(transaction=False)
                for key in keys[start:start + group]:
                    pipe.get(self.redis_key(key))
                values = self._call(pipe.execute)
                for key, out, value in zip(keys[start:start + group], outs[start:start + group], values, strict=True):
                    try:
                        results.append(self._unpack_into(key, value, out))
                    except (CorruptChunkError, BadChunkError) as exc:
                        results.append(None)
                        first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return results

    def _get_direct(self, keys: list[bytes], outs: Sequence[torch.Tensor], results: list[int | None]) -> Exception | None:
        """One pipeline whose values land in `outs` (RespReader); appends to `results`, returns the first error."""
        for out in outs:
            check_out(out, 0)
        heads = [memoryview(bytearray(HEADER_BYTES)) for _ in keys]
        assert self._reader is not None
        lengths = self._call(self._reader.get_into, [self.redis_key(k) for k in keys], heads, outs)
        first_error: Exception | None = None
        for key, head, out, length in zip(keys, heads, outs, lengths, strict=True):
            try:
                results.append(self._check_direct(key, head, out, length))
            except (CorruptChunkError, BadChunkError) as exc:
                results.append(None)
                first_error = first_error or exc
        return first_error

    def _check_direct(self, key: bytes, head: memoryview, out: torch.Tensor, length: int | None) -> int | None:
        if length is None:
            self._ledger.record(key, None)  # removed or evicted by Redis behind our back
            return None
        if length < 0:
            raise BadChunkError(f"output buffer holds {out.numel()} bytes but chunk {self.redis_key(key)} is "
                                f"{-length} bytes; pass a larger buffer")
        header = self._verified(key, head, out[:length].numpy().data)
        self._ledger.record_if_changed(key, meta_of(header))
        return header.stored_bytes

    def _unpack_into(self, key: bytes, value: bytes | None, out: torch.Tensor) -> int | None:
        if value is None:
            self._ledger.record(key, None)  # removed or evicted by Redis behind our back
            return None
        view = memoryview(value)
        header = self._verified(key, view, view[HEADER_BYTES:])
        copy_payload(view, header, out)
        self._ledger.record_if_changed(key, meta_of(header))
        return header.stored_bytes

    def _verified(self, key: bytes, head: memoryview, payload: memoryview) -> ChunkHeader:
        """The value's header, its payload checked; a corrupt value is deleted (CorruptChunkError)."""
        try:
            header = header_of(key, head, self.redis_key(key))
            verify_payload(header, payload)
        except CorruptChunkError as exc:
            self._drop_corrupt(key, bytes(head[:HEADER_BYTES]), exc)
            raise
        return header

    def _drop_corrupt(self, key: bytes, header_bytes: bytes, exc: Exception) -> None:
        try:
            self._call(self._delete_if_header, [self.redis_key(key)], [header_bytes])
        except TierIOError:
            pass
        self._ledger.record(key, None)
        with self._lock:
            self.num_corrupt_dropped += 1
        logger.warning("RedisTier dropped corrupt chunk %s: %s", self.redis_key(key), exc)

    # ---- meta, remove, keys ---------------------------------------------------------------------
    def meta(self, key: bytes) -> ChunkMeta | None:
        key = validate_key(key)
        with self._key_locks.holding([key]):
            raw = self._call(self.client.getrange, self.redis_key(key), 0, HEADER_BYTES - 1)
            meta = self._meta_from_raw(key, raw)
            self._ledger.record(key, meta)
        return meta

    def _meta_from_raw(self, key: bytes, raw: bytes | None) -> ChunkMeta | None:
        if not raw:
            return None
        try:
            return meta_of(header_of(key, memoryview(raw), self.redis_key(key)))
        except CorruptChunkError as exc:
            self._drop_corrupt(key, raw, exc)
            return None

    def remove(self, key: bytes) -> bool:
        key = validate_key(key)
        with self._key_locks.holding([key]):
            existed = bool(self._call(self.client.delete, self.redis_key(key)))
            self._ledger.record(key, None)
        return existed

    def keys(self) -> Iterator[tuple[bytes, ChunkMeta]]:
        """SCAN every chunk key (all primaries on a Cluster), read headers pipelined, rebuild this view.

        With Redis down this logs a warning and yields nothing: there is nothing to recover now, and
        chunks stored there are still found later through `meta`/`get_into`.
        """
        try:
            found = self._scan()
        except TierIOError as exc:
            logger.warning("RedisTier: cannot list chunks (%s); recovering none from Redis", exc)
            return iter([])
        return iter(self._ledger.replace_all(found))

    def _scan(self) -> dict[bytes, ChunkMeta]:
        found: dict[bytes, ChunkMeta] = {}
        for key, raw in scan_headers(self.client, self._call, f"{self.prefix}:chunk:*", key_of_name):
            meta = self._meta_from_raw(key, raw)
            if meta is not None:
                found[key] = meta
        return found

    # ---- pool, lifecycle --------------------------------------------------------------------------
    def submit_put(self, key: bytes, payload: torch.Tensor, meta: ChunkMeta) -> Future[None]:
        return self._pool.submit(self.put, key, payload, meta)

    def submit_get(self, key: bytes, out: torch.Tensor) -> Future[int | None]:
        return self._pool.submit(self.get_into, key, out)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self._pool.shutdown(wait=True)
        try:
            self.client.close()
        except redis.RedisError:
            pass

    def __len__(self) -> int:
        return len(self._ledger)

