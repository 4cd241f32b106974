"""Plumbing of the Redis tier: client factory, fail-fast breaker, per-key locks, staging buffers, batching."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import redis

from kvstore.errors import TierIOError

logger = logging.getLogger(__name__)


def make_client(url: str, *, cluster: bool = False, socket_timeout_s: float = 5.0,
                connect_timeout_s: float = 1.0) -> Any:
    """A redis-py client for one server or a Cluster; no retries: a failure is reported at once."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    options = {"socket_timeout": socket_timeout_s, "socket_connect_timeout": connect_timeout_s,
               "retry": Retry(NoBackoff(), 0)}
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)


class Breaker:
    """Fail fast for `retry_after_s` after a connection failure; log one line per outage."""

    def __init__(self, url: str, retry_after_s: float) -> None:
        self.url, self.retry_after_s = url, retry_after_s
        self._down_until = 0.0
        self._last_error = ""
        self._lock = threading.Lock()

    def check(self) -> None:
        if time.monotonic() < self._down_until:
            raise TierIOError(f"Redis at {self.url} is unreachable ({self._last_error}); "
                              f"retrying after {self.retry_after_s:g} s; treat as a miss")

    def failed(self, exc: Exception) -> None:
        with self._lock:
            if self._down_until == 0.0:
                logger.warning("Redis tier: %s unreachable (%s); reads are misses, writes not stored", self.url, exc)
            self._down_until = time.monotonic() + self.retry_after_s
            self._last_error = str(exc) or type(exc).__name__

    def succeeded(self) -> None:
        if self._down_until:
            with self._lock:
                if self._down_until:
                    logger.info("Redis tier: %s reachable again", self.url)
                self._down_until = 0.0


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
