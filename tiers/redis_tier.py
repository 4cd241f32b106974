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
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import redis
import torch

from kvstore.chunk_format import HEADER_BYTES, ChunkHeader, make_header, verify_payload
from kvstore.errors import BadChunkError, ConfigError, CorruptChunkError, TierFullError, TierIOError
from kvstore.hashing import validate_key
from kvstore.redact import redact_url
from kvstore.types import ChunkMeta, TierKind
from tiers.base import Tier, check_out, check_payload
from tiers.redis_reader import RespReader
from tiers.redis_support import Breaker, KeyLocks, StagingBuffer, batches, make_client
from tiers.registry import register_tier

logger = logging.getLogger(__name__)

DEFAULT_MAX_VALUE_BYTES = 512 << 20  # Redis's default proto-max-bulk-len
# Delete a value only while its header is still the one we found corrupt (another node may have rewritten it).
_DELETE_IF_HEADER = (f"if redis.call('GETRANGE', KEYS[1], 0, {HEADER_BYTES - 1}) == ARGV[1] "
                     "then return redis.call('DEL', KEYS[1]) end return 0")


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
        self._breaker = Breaker(self.url, retry_after_s)
        self._delete_if_header = self.client.register_script(_DELETE_IF_HEADER)
        self._lock = threading.Lock()
        self._index: dict[bytes, ChunkMeta] = {}
        self._committed_bytes = 0
        self._reserved_bytes = 0
        self._max_value_bytes: int | None = None
        self._staging = StagingBuffer()
        self._key_locks = KeyLocks()  # this process's writes of one key land in Redis and the index in one order
        self.num_corrupt_dropped = 0
        self._pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="redis-io")
        # GETs into the caller's buffers on raw sockets (plain single-server clients we built ourselves)
        self._reader = RespReader(self.client.connection_pool.connection_kwargs, socket_timeout_s) \
            if client is None and RespReader.supports(self.client) else None
        self._durable = self._ask_persistence()
        self._durable_checked_at = time.monotonic()
        logger.info("Redis tier at %s (prefix %r%s)", self.url, prefix, ", cluster" if cluster else "")

    # ---- durability --------------------------------------------------------------------------
    @property
    def is_durable(self) -> bool:
        """Only a Redis that persists (AOF, or RDB snapshots) keeps a copy across its own restart;
        asked with CONFIG GET at start and again in the background every minute (never on the
        caller's thread: it may hold the store's lock). Unknown (CONFIG refused, Redis down) = not durable."""
        now = time.monotonic()
        if now - self._durable_checked_at > 60.0:
            self._durable_checked_at = now
            threading.Thread(target=self._refresh_durability, name="redis-durability", daemon=True).start()
        return self._durable

    def _refresh_durability(self) -> None:
        self._durable = self._ask_persistence()

    def _ask_persistence(self) -> bool:
        try:
            aof = self.client.config_get("appendonly").get("appendonly", "no")
            save = self.client.config_get("save").get("save", "")
        except (redis.RedisError, AttributeError, TypeError) as exc:  # refused, down, or a cluster's reply shape
            logger.warning("Redis tier at %s: cannot read its persistence settings (%s); its copies do not "
                           "count as durable", self.url, exc)
            return False
        durable = str(aof).lower() == "yes" or bool(str(save).strip())
        if not durable:
            logger.warning("Redis tier at %s persists nothing (appendonly no, save \"\"): its copies do not count "
                           "as durable; enable AOF (appendonly yes) to make them so", self.url)
        return durable

    # ---- names, accounting ------------------------------------------------------------------
    def redis_key(self, key: bytes) -> str:
        return f"{self.prefix}:chunk:{key.hex()}"

    @property
    def used_bytes(self) -> int:
        return self._committed_bytes + self._reserved_bytes

    def footprint(self, stored_bytes: int) -> int:
        return HEADER_BYTES + stored_bytes

    def _reserve(self, key: bytes, nbytes: int) -> None:
        with self._lock:
            old = self._index.get(key)
            freed = self.footprint(old.stored_bytes) if old is not None else 0
            used = self._committed_bytes + self._reserved_bytes
            if used - freed + nbytes > self.capacity_bytes:
                raise TierFullError(f"RedisTier: a {nbytes}-byte chunk does not fit (used {used} of "
                                    f"{self.capacity_bytes} bytes); evict first")
            self._reserved_bytes += nbytes

    def _unreserve(self, nbytes: int) -> None:
        with self._lock:
            self._reserved_bytes -= nbytes

    def _record(self, key: bytes, meta: ChunkMeta | None) -> None:
        with self._lock:
            old = self._index.pop(key, None)
            if old is not None:
                self._committed_bytes -= self.footprint(old.stored_bytes)
            if meta is not None:
                self._index[key] = meta
                self._committed_bytes += self.footprint(meta.stored_bytes)

    # ---- Redis calls --------------------------------------------------------------------------
    def _call(self, fn: Any, *args: Any) -> Any:
        """Run one Redis call (or pipeline execute), mapping failures to TierIOError / TierFullError."""
        self._breaker.check()
        try:
            result = fn(*args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._breaker.failed(exc)
            raise TierIOError(f"Redis at {self.url} failed: {exc}; treat as a miss / not stored") from exc
        except redis.ResponseError as exc:
            if isinstance(exc, redis.exceptions.OutOfMemoryError) or "maxmemory" in str(exc):
                raise TierFullError(f"Redis at {self.url} is at its maxmemory ({exc}); raise maxmemory, "
                                    "lower this tier's capacity, or let Redis evict (allkeys-lru)") from exc
            raise TierIOError(f"Redis at {self.url} refused the command: {exc}") from exc
        except redis.RedisError as exc:
            raise TierIOError(f"Redis at {self.url} failed: {exc}") from exc
        self._breaker.succeeded()
        return result

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
        body: Any = payload.cpu().numpy()
        header = make_header(key=key, payload=memoryview(body), codec_id=meta.codec_id, raw_bytes=meta.raw_bytes,
                             layout_fingerprint=meta.layout_fingerprint)
        value: Any = self._staging.get(nbytes) if staged else np.empty(nbytes, dtype=np.uint8)
        value[:HEADER_BYTES] = np.frombuffer(header.pack(), dtype=np.uint8)
        value[HEADER_BYTES:] = body
        return memoryview(value)

    def put(self, key: bytes, payload: torch.Tensor, meta: ChunkMeta) -> None:
        self.put_many([(key, payload, meta)])

    def put_many(self, items: Sequence[tuple[bytes, torch.Tensor, ChunkMeta]]) -> None:
        """Pipelined SETs (at most `pipeline_bytes` per round trip); all reserved before any is sent."""
        values = [self._encode(key, payload, meta, staged=len(items) == 1) for key, payload, meta in items]
        reserved = []
        try:
            for (key, _, _), value in zip(items, values, strict=True):
                self._reserve(key, len(value))
                reserved.append(len(value))
            for start, stop in batches([len(v) for v in values], self.pipeline_bytes):
                with self._key_locks.holding([key for key, _, _ in items[start:stop]]):
                    pipe = self.client.pipeline(transaction=False)
                    for (key, _, _), value in zip(items[start:stop], values[start:stop], strict=True):
                        pipe.set(self.redis_key(key), value)
                    self._call(pipe.execute)
                    for key, _, meta in items[start:stop]:
                        self._record(key, meta)
        finally:
            self._unreserve(sum(reserved))

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
            self._record(key, None)  # removed or evicted by Redis behind our back
            return None
        if length < 0:
            raise BadChunkError(f"output buffer holds {out.numel()} bytes but chunk {self.redis_key(key)} is "
                                f"{-length} bytes; pass a larger buffer")
        try:
            header = self._header_of(key, head)
            verify_payload(header, out[:length].numpy().data)
        except CorruptChunkError as exc:
            self._drop_corrupt(key, bytes(head), exc)
            raise
        meta = _meta_of(header)
        if self._index.get(key) != meta:
            self._record(key, meta)
        return header.stored_bytes

    def _unpack_into(self, key: bytes, value: bytes | None, out: torch.Tensor) -> int | None:
        if value is None:
            self._record(key, None)  # removed or evicted by Redis behind our back
            return None
        view = memoryview(value)
        try:
            header = self._header_of(key, view)
            verify_payload(header, view[HEADER_BYTES:])
        except CorruptChunkError as exc:
            self._drop_corrupt(key, bytes(view[:HEADER_BYTES]), exc)
            raise
        check_out(out, header.stored_bytes)
        src = np.frombuffer(view, dtype=np.uint8, count=header.stored_bytes, offset=HEADER_BYTES)
        if out.device.type == "cpu":
            out[: header.stored_bytes].numpy()[:] = src
        else:
            out[: header.stored_bytes].copy_(torch.from_numpy(src.copy()))
        meta = _meta_of(header)
        if self._index.get(key) != meta:  # seen for the first time, or rewritten by another node
            self._record(key, meta)
        return header.stored_bytes

    def _header_of(self, key: bytes, view: memoryview) -> ChunkHeader:
        header = ChunkHeader.unpack(view[:HEADER_BYTES])
        if header.key != key:
            raise CorruptChunkError(f"Redis value {self.redis_key(key)} holds chunk {header.key.hex()}")
        return header

    def _drop_corrupt(self, key: bytes, header_bytes: bytes, exc: Exception) -> None:
        try:
            self._call(self._delete_if_header, [self.redis_key(key)], [header_bytes])
        except TierIOError:
            pass
        self._record(key, None)
        with self._lock:
            self.num_corrupt_dropped += 1
        logger.warning("RedisTier dropped corrupt chunk %s: %s", self.redis_key(key), exc)

    # ---- meta, remove, keys ---------------------------------------------------------------------
    def meta(self, key: bytes) -> ChunkMeta | None:
        key = validate_key(key)
        with self._key_locks.holding([key]):
            raw = self._call(self.client.getrange, self.redis_key(key), 0, HEADER_BYTES - 1)
            meta = self._meta_from_raw(key, raw)
            self._record(key, meta)
        return meta

    def _meta_from_raw(self, key: bytes, raw: bytes | None) -> ChunkMeta | None:
        if not raw:
            return None
        try:
            return _meta_of(self._header_of(key, memoryview(raw)))
        except CorruptChunkError as exc:
            self._drop_corrupt(key, raw, exc)
            return None

    def remove(self, key: bytes) -> bool:
        key = validate_key(key)
        with self._key_locks.holding([key]):
            existed = bool(self._call(self.client.delete, self.redis_key(key)))
            self._record(key, None)
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
        with self._lock:
            self._index = dict(found)
            self._committed_bytes = sum(self.footprint(meta.stored_bytes) for meta in found.values())
            return iter(list(found.items()))

    def _scan(self) -> dict[bytes, ChunkMeta]:
        names = self._call(lambda: list(self.client.scan_iter(match=f"{self.prefix}:chunk:*", count=1000)))
        found: dict[bytes, ChunkMeta] = {}
        for start in range(0, len(names), 512):
            batch = [(name, key) for name in names[start:start + 512] if (key := _key_of_name(name)) is not None]
            pipe = self.client.pipeline(transaction=False)
            for name, _ in batch:
                pipe.getrange(name, 0, HEADER_BYTES - 1)
            for (_, key), raw in zip(batch, self._call(pipe.execute), strict=True):
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
        return len(self._index)


def _meta_of(header: ChunkHeader) -> ChunkMeta:
    return ChunkMeta(codec_id=header.codec_id, raw_bytes=header.raw_bytes, stored_bytes=header.stored_bytes,
                     layout_fingerprint=header.layout_fingerprint)


def _key_of_name(name: bytes | str) -> bytes | None:
    text = name.decode() if isinstance(name, bytes) else name
    try:
        key = bytes.fromhex(text.rsplit(":", 1)[1])
    except (ValueError, IndexError):
        return None
    return key if len(key) == 16 else None
