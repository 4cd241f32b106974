"""Loads that never hold up a step (pure Python, no vllm import): the worker half of vLLM's async-load contract.

    start(spec)      the scheduler reported the load as asynchronous: fetch and scatter on a loader thread
                     while vLLM keeps running the other requests (this one waits in WAITING_FOR_REMOTE_KVS)
    finished()       ids of requests whose loads are done, and the blocks that failed among them; vLLM
                     hears both in the same step, so the failed blocks are recomputed before the request runs
    wait_any(s)      block up to s seconds until some load ends; the worker calls it in a step where vLLM
                     scheduled nothing, so an engine with only loading requests does not re-step every
                     millisecond (each step a round trip between its processes, on the cores the loads need)
    wait_for(ids, s) block up to s seconds until the named requests' loads end (the step's end waiting for
                     the loads it started: connector/vllm/finish_wait.py)

A load writes only its own request's blocks, which vLLM does not touch until the request is reported
finished, so loading beside the forward pass is safe. Layer-by-layer loading (start the forward pass
while later layers still arrive) is a GPU matter: `wait_for_layer_load` is where it would wait per layer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from connector.vllm.plan import TransferSpec

logger = logging.getLogger(__name__)
_LOADERS = 2


class AsyncLoads:
    """Runs `load(spec) -> failed block ids` in the background, one future per request."""

    def __init__(self, load: Callable[[TransferSpec], set[int]], block_size: int) -> None:
        self._load, self._block_size = load, block_size
        self._pool = ThreadPoolExecutor(_LOADERS, thread_name_prefix="kvstore-vllm-load")
        self._lock = threading.Lock()
        self._running: dict[str, Future[set[int]]] = {}

    def start(self, spec: TransferSpec) -> None:
        with self._lock:
            self._running[spec.req_id] = self._pool.submit(self._safe_load, spec)

    def _safe_load(self, spec: TransferSpec) -> set[int]:
        try:
            return self._load(spec)
        except Exception:  # never leave vLLM waiting on a request: every block of the load is recomputed
            logger.exception("kvstore connector: background load of %s failed; vLLM recomputes it", spec.req_id)
            return set(spec.block_ids[spec.start_token // self._block_size:])

    def finished(self) -> tuple[set[str], set[int]]:
        """(request ids whose loads ended, block ids that failed to load among them)."""
        done: set[str] = set()
        failed: set[int] = set()
        with self._lock:
            for req_id, future in list(self._running.items()):
                if future.done():
                    del self._running[req_id]
                    done.add(req_id)
                    failed |= future.result()
        return done, failed

    def wait_any(self, timeout_s: float) -> bool:
        """Wait until a running load ends or `timeout_s` passes; True when one has ended (or none runs)."""
        with self._lock:
            running = list(self._running.values())
        if not running:
            return True
        done, _ = wait(running, timeout=timeout_s, return_when=FIRST_COMPLETED)
        return bool(done)

    def wait_for(self, req_ids: list[str], timeout_s: float) -> bool:
        """Wait until the loads of `req_ids` end or `timeout_s` passes; True when none of them still runs."""
        with self._lock:
            running = [self._running[r] for r in req_ids if r in self._running]
        if not running:
            return True
        _, pending = wait(running, timeout=timeout_s)
        return not pending

    def __len__(self) -> int:
        with self._lock:
            return len(self._running)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

