"""`EmbeddedStore`: an `EngineStore` over a TieredStore in the engine's own process (no daemon).

Each call runs on one of a few worker threads and the caller waits at most the call's budget
(connector/deadlines.py): a stalled disk or Redis tier cannot hold the engine. A call past its budget
keeps running on its thread until the store answers, and the buffers it reads or writes stay its
own until then (`Guarded.pending`); when every thread is still busy with such calls, new calls fail
at once (a miss) rather than queue behind them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import torch

from connector.deadlines import Deadlines
from connector.engine_store import EngineStore, LateCall
from kvstore.errors import TierIOError
from kvstore.hashing import ChunkKey, TokenIds
from kvstore.kv_scope import KeyScope
from kvstore.store import TieredStore
from kvstore.types import PutResult

T = TypeVar("T")
_NUM_THREADS = 4


class EmbeddedStore(EngineStore):
    """`store`'s calls within `deadlines`, on worker threads named after `name`."""

    def __init__(self, store: TieredStore, deadlines: Deadlines, name: str = "embedded") -> None:
        super().__init__(deadlines, name)
        self.store = store
        self.layout = store.layout
        self.root_key = store.root_key
        self._pool = ThreadPoolExecutor(_NUM_THREADS, thread_name_prefix=f"kvstore-{name}")
        self._free_threads = threading.BoundedSemaphore(_NUM_THREADS)

    def _within(self, budget_s: float, fn: Callable[..., T], *args: object) -> T:
        if not self._free_threads.acquire(blocking=False):
            raise TierIOError("every store thread is still waiting on earlier calls")
        future = self._pool.submit(self._run, fn, *args)
        try:
            return future.result(timeout=budget_s)
        except FutureTimeout:
            raise LateCall(future) from None

    def _run(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return fn(*args)
        finally:
            self._free_threads.release()

    def chunk_keys(self, token_ids: TokenIds, scope: KeyScope | None = None) -> list[ChunkKey]:
        return self.store.chunk_keys(token_ids, scope)

    def empty_chunk(self) -> torch.Tensor:
        return self.store.empty_chunk()

    def _lookup_batch(self, keys: list[bytes]) -> int:
        return self.store.lookup_keys(keys)

    def _get_batch(self, keys: list[bytes], outs: list[torch.Tensor]) -> list[bool]:
        return self.store.get_many(keys, outs)

    def _put_batch(self, keys: list[bytes], chunks: list[torch.Tensor]) -> PutResult:
        return self.store.put_many(keys, chunks)

    def _remove(self, key: bytes) -> bool:
        return self.store.remove(key)

    def _stats(self) -> dict[str, Any]:
        return self.store.stats()

    def _flush(self, timeout_s: float | None) -> bool:
        return self.store.flush(timeout_s)

    def _close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.store.close()
