"""Plumbing of the Redis tier: client factory, calls behind a breaker (kvstore/breaker.py), per-key locks, staging buffers, batching, SCAN."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import redis

from kvstore.breaker import Breaker
from kvstore.chunk_format import HEADER_BYTES
from kvstore.errors import TierFullError, TierIOError

logger = logging.getLogger(__name__)
T = TypeVar("T")


def make_client(url: str, *, cluster: bool = False, socket_timeout_s: float = 5.0,
                connect_timeout_s: float = 1.0) -> Any:
    """A redis-py client for one server or a Cluster; no retries: a failure is reported at once.

    Typed Any: a library boundary (redis-py types every reply as a union of bytes, str, lists...)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    options = {"socket_timeout": socket_timeout_s, "socket_connect_timeout": connect_timeout_s,
               "retry": Retry(NoBackoff(), 0)}
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)


class RedisCalls:
    """Runs each Redis call behind a `Breaker` (open on the first connection failure, every call tried again
    after `retry_after_s`) and maps redis-py's errors to TierIOError / TierFullError (treat as a miss)."""

    def __init__(self, url: str, retry_after_s: float) -> None:
        self.url, self.retry_after_s = url, retry_after_s
        self.breaker = Breaker(f"Redis tier at {url}", failures=1, cooldown_s=retry_after_s, probe=False)

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run one Redis call (or pipeline execute), mapping failures to TierIOError / TierFullError."""
        if not self.breaker.allow():
            raise TierIOError(f"Redis at {self.url} is unreachable ({self.breaker.last_failure}); "
                              f"retrying after {self.retry_after_s:g} s; treat as a miss")
        try:
            result = fn(*args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.breaker.record(False, str(exc) or type(exc).__name__)
            raise TierIOError(f"Redis at {self.url} failed: {exc}; treat as a miss / not stored") from exc
        except redis.ResponseError as exc:
            self.breaker.record(True)  # it answered
            if isinstance(exc, redis.exceptions.OutOfMemoryError) or "maxmemory" in str(exc):
                raise TierFullError(f"Redis at {self.url} is at its maxmemory ({exc}); raise maxmemory, "
                                    "lower this tier's capacity, or let Redis evict (allkeys-lru)") from exc
            raise TierIOError(f"Redis at {self.url} refused the command: {exc}") from exc
        except redis.RedisError as exc:
            self.breaker.record(True)
            raise TierIOError(f"Redis at {self.url} failed: {exc}") from exc
        self.breaker.record(True)
        return result


class KeyLocks:
    """Striped per-key locks, always taken in stripe order (no deadlock between batches)."""

    def __init__(self, num_stripes: int = 64) -> None:
        self._locks = [threading.Lock() for _ in range(num_stripes)]

    @contextlib.contextmanager
    def holding(self, keys: Sequence[bytes]) -> Iterator[None]:
        stripes = sorted({key[0] % len(self._locks) for key in keys})
        with contextlib.ExitStack() as stack:
            for stripe in stripes:
                stack.enter_context(self._locks[stripe])
            yield


class StagingBuffer(threading.local):
    """One growing value buffer per thread (a put is synchronous: the buffer is free once it returns)."""

    def __init__(self) -> None:
        self.buffer = np.empty(0, dtype=np.uint8)

    def get(self, nbytes: int) -> np.ndarray:
        if self.buffer.size < nbytes:
            self.buffer = np.empty(nbytes, dtype=np.uint8)
        return self.buffer[:nbytes]


def batches(sizes: list[int], limit: int) -> Iterator[tuple[int, int]]:
    """[start, stop) runs of `sizes` whose sum stays within `limit` (at least one item each)."""
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > limit:
            yield start, i
            start, total = i, 0
        total += size
    if start < len(sizes):
        yield start, len(sizes)


def scan_headers(client: Any, call: Callable[..., Any], match: str,
                 key_of: Callable[[bytes | str], bytes | None]) -> Iterator[tuple[bytes, bytes | None]]:
    """(chunk key, raw header) of every name matching `match` (SCAN on all primaries of a Cluster),
    headers read in pipelines of 512; names `key_of` rejects are skipped. `call` runs each Redis call."""
    names = call(lambda: list(client.scan_iter(match=match, count=1000)))
    for start in range(0, len(names), 512):
        batch = [(name, key) for name in names[start:start + 512] if (key := key_of(name)) is not None]
        pipe = client.pipeline(transaction=False)
        for name, _ in batch:
            pipe.getrange(name, 0, HEADER_BYTES - 1)
        for (_, key), raw in zip(batch, call(pipe.execute), strict=True):
            yield key, raw
