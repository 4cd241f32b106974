"""`Runtime`: what the daemon's routes share (backend, tenants, thread limiters), and `runtime(request)` to reach it.

Blocking store calls go through `Runtime.run` (bounded threads, a deadline, abandoned calls
counted): never on the event loop. Routes get the Runtime typed from `runtime(request)`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TypeVar

import anyio
from starlette.requests import HTTPConnection

from service import metrics
from service.abandoned import AbandonedCalls
from service.backend import Backend
from service.errors import BackendTimeoutError, TooManyAbandonedError
from service.tenants import TenantDirectory

logger = logging.getLogger(__name__)
PUT_MARGIN_S = 0.25  # a put answers within the store's put_timeout_s plus this
T = TypeVar("T")


class Runtime:
    """What the routes share: the backend, the tenant directory and the thread limiter."""

    def __init__(self, backend: Backend, tenants: TenantDirectory, io_threads: int) -> None:
        self.backend = backend
        self.request_timeout_s = backend.config.request_timeout_s
        self.put_timeout_s = backend.store.config.put_timeout_s + PUT_MARGIN_S
        self.tenants = tenants
        self.limiter = anyio.CapacityLimiter(io_threads)
        # Lookups that may ask a shared tier (PFS, Redis) have their own threads: a stalled Redis
        # then holds at most these, never the threads puts and gets need.
        self.lookup_limiter = anyio.CapacityLimiter(max(2, io_threads // 2))
        self.abandoned = AbandonedCalls(backend.config.max_abandoned_calls)
        self.requests = metrics.RequestMetrics()
        self.fast_lookups = 0  # answered by FastLookupMiddleware

    async def run(self, fn: Callable[..., T], *args: object, timeout_s: float | None = None,
                  limiter: anyio.CapacityLimiter | None = None, refuse: bool = True) -> T:
        """Run a blocking store call on the bounded thread pool, never on the event loop, and answer
        within `timeout_s` (service.request_timeout_s by default) even when the backend hangs: the
        call is then abandoned (it finishes on its thread, counted in `abandoned`) and the client gets
        a 503. With service.max_abandoned_calls of them still running, calls are refused at once (503)."""
        timeout_s = self.request_timeout_s if timeout_s is None else timeout_s
        call = self.abandoned.track(fn, args, refuse=refuse)
        try:
            with anyio.move_on_after(timeout_s):
                return await anyio.to_thread.run_sync(call, limiter=limiter or self.limiter,  # type: ignore[no-any-return]
                                                      abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():  # the request itself was cancelled: the call runs on, uncounted otherwise
            call.abandon()
            raise
        call.abandon()
        raise BackendTimeoutError(f"the store did not answer within {timeout_s:g} s (a disk or Redis is slow "
                                  "or the I/O threads are all busy); retry later")

    async def run_put(self, fn: Callable[..., T], *args: object) -> T:
        """A put: answered within put_timeout_s (+ PUT_MARGIN_S), whatever the backend does."""
        return await self.run(fn, *args, timeout_s=self.put_timeout_s)

    async def run_lookup(self, fn: Callable[..., T], *args: object) -> T:
        """Lookups without a shared level are index reads (microseconds): run inline, skip the thread hop.
        Otherwise on the lookup threads; past service.shared_lookup_timeout_s the answer is what the local
        index holds (no shared-tier probe), so a stalled Redis costs hits it alone knows of, not the lookup."""
        if self.backend.lookup_is_memory_only:
            return fn(*args)
        try:
            return await self.run(fn, *args, timeout_s=self.backend.config.shared_lookup_timeout_s, limiter=self.lookup_limiter)
        except (BackendTimeoutError, TooManyAbandonedError):  # a shared tier is stalled: this node's index answers
            return await self.run(functools.partial(fn, local_only=True), *args, refuse=False)


def runtime(connection: HTTPConnection) -> Runtime:
    """The daemon's Runtime (set by create_app's lifespan before the first request)."""
    rt = connection.app.state.runtime
    assert isinstance(rt, Runtime)
    return rt
