"""How `KVStoreClient` takes a failed call: bad input raises, anything else is a miss, a few are retried.

    the daemon answered 400 / 422 (bad key, chunk, layout)   BAD_INPUT: raised to the caller
    503 (a stalled store call, the abandoned-call cap)        not retried (the daemon already waited out
                                                              its deadline): get -> miss, put -> not_stored
    429 (quota, memory budget, segment cap)                   not retried: room comes back in seconds
    a timeout                                                 not retried (the caller already waited)
    a reset or refused connection, a busy descriptor socket   retried once after a short pause, from
                                                              a budget (RetryBudget), then a miss

`RetryBudget` is the retry throttling of gRPC and Finagle: each call earns `ratio` of a retry, up
to `max_tokens`, and a retry spends one, so a daemon that is down or overloaded never gets more
than (1 + ratio) x the calls it would have got without retries.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from connector.client_segment import DescriptorSocketBusy
from connector.daemon_http import TRANSPORT_ERRORS, RemoteError
from kvstore.errors import BadChunkError, ConfigError, LayoutMismatchError

_T = TypeVar("_T")
BAD_INPUT = (LayoutMismatchError, BadChunkError, ConfigError)


def is_retryable(exc: BaseException) -> bool:
    """A connection reset or refused (not a timeout), or a descriptor socket that closed on us."""
    if isinstance(exc, RemoteError) or isinstance(exc, TimeoutError) or isinstance(exc.__cause__, TimeoutError):
        return False
    return isinstance(exc, (*TRANSPORT_ERRORS, ConnectionError, DescriptorSocketBusy))


class RetryBudget:
    """Retries allowed: `ratio` per call made, at most `max_tokens` saved up. Thread-safe."""

    def __init__(self, ratio: float = 0.1, max_tokens: float = 3.0, backoff_s: float = 0.05,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.ratio, self.max_tokens, self.backoff_s = ratio, max_tokens, backoff_s
        self._tokens = max_tokens
        self._sleep = sleep
        self._lock = threading.Lock()
        self.num_retries = 0

    def _withdraw(self) -> bool:
        with self._lock:
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            self.num_retries += 1
            return True

    def call(self, fn: Callable[[], _T]) -> _T:
        """`fn()`, once more after a pause when it failed in a retryable way and the budget allows."""
        with self._lock:
            self._tokens = min(self.max_tokens, self._tokens + self.ratio)
        try:
            return fn()
        except Exception as exc:
            if not is_retryable(exc) or not self._withdraw():
                raise
        self._sleep(self.backoff_s * (0.5 + random.random()))
        return fn()
