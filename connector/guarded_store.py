"""`GuardedStore`: a store whose calls an engine waits on have deadlines, a breaker and a bounded save queue.

    lookup_keys   on a worker thread, at most `lookup_timeout_s`; past it (or breaker open): 0 chunks
    get_many      at most `load_timeout_s`; past it: all misses (the engine recomputes)
    put_many      at most `save_timeout_s`; past it: every chunk in `not_stored` with the reason
    save_async    a bounded queue drained by one thread: the engine's step never waits for a save;
                  past `save_queue_chunks` chunks are dropped (counted, logged once per interval).
                  Every engine plugin saves through it (vLLM's steps and answers, LMCache's puts,
                  SGLang's backups), from buffers of its own (engine_store.owned_buffer)

A call that missed its deadline keeps running on its thread until the store answers (the client's
own socket timeout bounds it): the buffers it reads or writes stay its own until then. Callers whose
buffers go back to an engine's allocator use `get_guarded`/`put_guarded` and release them when
`pending` completes; `get_many`/`put_many` are for buffers nobody else reuses. Bad input (wrong key,
shape or dtype) still raises; every other failure is a miss or an unsaved chunk, counted in `counters`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from connector.deadlines import Breaker, Deadlines
from connector.engine_store import EngineStore, StoreOptions, open_store
from kvstore.errors import BadChunkError, ConfigError, KVStoreError, LayoutMismatchError, TierIOError
from kvstore.hashing import ChunkKey, TokenIds
from kvstore.kv_scope import KeyScope
from kvstore.layout import KVLayout
from kvstore.types import PutResult

logger = logging.getLogger(__name__)
T = TypeVar("T")
_BAD_INPUT = (BadChunkError, LayoutMismatchError, ConfigError)
_NUM_THREADS = 4
_DROP_LOG_INTERVAL_S = 10.0
COUNTER_NAMES = ("lookups", "lookup_timeouts", "loads", "load_timeouts", "saves", "save_timeouts", "failures",
                 "stats", "stat_timeouts", "skipped_breaker_open", "dropped_save_chunks", "unsaved_chunks",
                 "breaker_opened")


@dataclass(frozen=True, slots=True)
class Guarded(Generic[T]):
    """A budgeted call's answer; `pending` is the still-running call when the deadline passed (else None)."""

    value: T
    pending: Future[T] | None = None


class GuardedStore:
    """Wraps an `EngineStore` (the daemon's client or an embedded store); an `EngineStore` itself."""

    def __init__(self, store: EngineStore, deadlines: Deadlines, name: str = "store") -> None:
        self.store, self.deadlines, self.name = store, deadlines, name
        self.layout = store.layout
        self.root_key = store.root_key
        self.breaker = Breaker(name, deadlines.breaker_failures, deadlines.breaker_cooldown_s)
        self._pool = ThreadPoolExecutor(_NUM_THREADS, thread_name_prefix=f"kvstore-{name}")
        self._free_threads = threading.BoundedSemaphore(_NUM_THREADS)
        self._counters_lock = threading.Lock()
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        self._saves: queue.Queue[tuple[list[bytes], list[torch.Tensor]] | None] = queue.Queue()
        self._queued_chunks = 0
        self._last_drop_log = 0.0
        self._saver = threading.Thread(target=self._save_loop, name=f"kvstore-{name}-save", daemon=True)
        self._saver.start()

    def count(self, name: str, n: int = 1) -> None:
        with self._counters_lock:
            self.counters[name] += n

    # ----- the budgeted call ----------------------------------------------------------------------
    def _call(self, what: str, budget_s: float, default: T, fn: Callable[..., T], *args: object) -> Guarded[T]:
        self.count(what + "s")
        if not self.breaker.allow():
            self.count("skipped_breaker_open")
            return Guarded(default)
        if not self._free_threads.acquire(blocking=False):
            self._failed(what, "every store thread is waiting on earlier calls")
            return Guarded(default)
        future = self._pool.submit(self._run, fn, *args)
        try:
            value = future.result(timeout=budget_s)
        except FutureTimeout:
            self.count(what + "_timeouts")
            self._failed(what, f"no answer within {what}_timeout_s={budget_s}", timed_out=True)
            return Guarded(default, pending=future)
        except _BAD_INPUT:
            self.breaker.record(True)
            raise
        except (KVStoreError, OSError) as exc:
            self._failed(what, f"{type(exc).__name__}: {exc}")
            return Guarded(default)
        self.breaker.record(True)
        return Guarded(value)

    def _run(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return fn(*args)
        finally:
            self._free_threads.release()

    def _failed(self, what: str, why: str, *, timed_out: bool = False) -> None:
        self.count("failures")
        opened = self.breaker.times_opened
        self.breaker.record(False, f"{what}: {why}", timed_out=timed_out)
        if self.breaker.times_opened != opened:
            self.count("breaker_opened")

    # ----- EngineStore ----------------------------------------------------------------------------
    def chunk_keys(self, token_ids: TokenIds, scope: KeyScope | None = None) -> list[ChunkKey]:
        return self.store.chunk_keys(token_ids, scope)

    def lookup(self, token_ids: TokenIds, scope: KeyScope | None = None) -> int:
        return self.lookup_keys(self.chunk_keys(token_ids, scope)) * self.layout.chunk_tokens

    def lookup_keys(self, keys: Sequence[bytes]) -> int:
        keys = list(keys)
        if not keys:
            return 0
        return int(self._call("lookup", self.deadlines.lookup_timeout_s, 0, self.store.lookup_keys, keys).value)

    def contains(self, key: bytes) -> bool:
        return self.lookup_keys([key]) == 1

    def get_guarded(self, keys: Sequence[bytes], outs: Sequence[torch.Tensor]) -> Guarded:
        """`get_many` within the load budget; while `pending` runs, `outs` belong to it."""
        return self._call("load", self.deadlines.load_timeout_s, [False] * len(keys), self.store.get_many,
                          list(keys), list(outs))

    def get_many(self, keys: Sequence[bytes], outs: Sequence[torch.Tensor]) -> list[bool]:
        return list(self.get_guarded(keys, outs).value)

    def put_guarded(self, keys: Sequence[bytes], chunks: Sequence[torch.Tensor]) -> Guarded:
        """`put_many` within the save budget; while `pending` runs, `chunks` belong to it."""
        keys = list(keys)
        unsaved = PutResult(not_stored=dict.fromkeys(keys, f"kvstore {self.name}: not saved (store past its "
                                                           f"save_timeout_s, failing, or its breaker open)"))
        return self._call("save", self.deadlines.save_timeout_s, unsaved, self.store.put_many, keys, list(chunks))

    def put_many(self, keys: Sequence[bytes], chunks: Sequence[torch.Tensor]) -> PutResult:
        result: PutResult = self.put_guarded(keys, chunks).value
        return result

    def empty_chunk(self) -> torch.Tensor:
        return self.store.empty_chunk()

    def remove(self, key: bytes) -> bool:
        return bool(self._call("save", self.deadlines.save_timeout_s, False, self.store.remove, key).value)

    def stats(self) -> dict[str, Any]:
        """The store's stats within the load budget; raises TierIOError when it does not answer."""
        answer = self._call("stat", self.deadlines.load_timeout_s, None, self.store.stats)
        if answer.value is None:
            raise TierIOError(f"kvstore {self.name}: the store did not answer stats within "
                              f"{self.deadlines.load_timeout_s} s (or its breaker is open)")
        return dict(answer.value)

    # ----- saves off the engine's path ------------------------------------------------------------
    def save_async(self, keys: Sequence[bytes], chunks: Sequence[torch.Tensor]) -> int:
        """Queue chunks for saving; returns how many were queued (the rest were dropped, counted)."""
        keys, chunks = list(keys), list(chunks)
        with self._counters_lock:
            room = max(0, self.deadlines.save_queue_chunks - self._queued_chunks)
            taken = min(room, len(keys))
            self._queued_chunks += taken
        dropped = len(keys) - taken
        if dropped:
            self._dropped(dropped)
        if taken:
            self._saves.put((keys[:taken], chunks[:taken]))
        return taken

    def _dropped(self, n: int) -> None:
        self.count("dropped_save_chunks", n)
        now = time.monotonic()
        if now - self._last_drop_log >= _DROP_LOG_INTERVAL_S:
            self._last_drop_log = now
            logger.warning("kvstore %s: save queue full (%d chunks): %d chunks dropped so far; the store cannot "
                           "keep up (raise save_queue_chunks, or check the daemon)", self.name,
                           self.deadlines.save_queue_chunks, self.counters["dropped_save_chunks"])

    def _save_loop(self) -> None:
        while (item := self._saves.get()) is not None:
            keys, chunks = item
            try:
                result = self.put_many(keys, chunks)
                self.count("unsaved_chunks", len(result.not_stored))
                if result.not_stored:
                    logger.debug("kvstore %s: %d chunks not stored (%s)", self.name, len(result.not_stored),
                                 next(iter(result.not_stored.values())))
            except KVStoreError as exc:
                self.count("unsaved_chunks", len(keys))
                logger.warning("kvstore %s: save of %d chunks refused: %s", self.name, len(keys), exc)
            finally:
                with self._counters_lock:
                    self._queued_chunks -= len(keys)
                self._saves.task_done()

    def wait_saves(self) -> None:
        """Block until every queued save has been handed to the store (tests and benches)."""
        self._saves.join()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for the queued saves, then for the store's own lower-tier writes (within the save budget)."""
        self.wait_saves()
        budget = self.deadlines.save_timeout_s if timeout_s is None else timeout_s
        return bool(self._call("save", budget, False, self.store.flush, timeout_s).value)

    def close(self) -> None:
        self._saves.put(None)
        self._saver.join(timeout=self.deadlines.save_timeout_s * 2)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.store.close()


def open_guarded(options: StoreOptions, layout: KVLayout, name: str, *, model: str | None = None) -> GuardedStore:
    """`open_store` with the options' deadlines around it: what every engine plugin uses. `model`: the
    model the engine computes for, named to a daemon for its per-model hit counts."""
    return GuardedStore(open_store(options, layout, model=model), options.deadlines, name)
