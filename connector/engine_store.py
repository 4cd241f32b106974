"""`EngineStore`: the store as an engine plugin holds it: the one failure rule, one budget per kind of call,
a breaker and a bounded save queue, over the daemon (`KVStoreClient`) or an embedded store (`EmbeddedStore`).

    lookup_keys   within `lookup_timeout_s`; past it, failing, or breaker open: 0 chunks (a miss)
    get_many      within `load_timeout_s`; past it or failing: misses (the engine recomputes)
    put_many      within `save_timeout_s`; past it or failing: every chunk in `not_stored` with the reason
    save_async    a bounded queue drained by one thread (connector/save_queue.py): the engine's step never
                  waits for a save. Every engine plugin saves through it (vLLM's steps and answers, LMCache's
                  puts, SGLang's backups), from buffers of its own (plugin_store.owned_buffer)
    stats         within `control_timeout_s`; raises TierIOError when the store cannot answer

The failure rule, here and nowhere else on the engine's side (`_call`): bad input (a wrong key, shape,
dtype or layout; a 400 or 422 from the daemon) raises; any other failure (a timeout, a dead or
overloaded daemon, a 503 or 429, a failing tier) is a miss or an unsaved chunk, counted in `counters`
and told to the breaker (all but a 429: a store refusing for want of room is not broken). The layers
below raise; this one decides. Each budget is applied once, for the whole call: a subclass enforces it
(`_within`) at the socket (the daemon) or by waiting on a worker thread (embedded: a call past its budget
keeps running there and its buffers stay its own until `Guarded.pending` completes).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from connector.deadlines import CallKind, Deadlines
from connector.save_queue import SaveQueue
from kvstore.breaker import Breaker
from kvstore.errors import BadChunkError, ConfigError, KVStoreError, LayoutMismatchError, TierFullError, TierIOError
from kvstore.hashing import ChunkKey, TokenIds, validate_key
from kvstore.kv_scope import KeyScope
from kvstore.layout import KVLayout
from kvstore.types import PutResult

logger = logging.getLogger(__name__)
T = TypeVar("T")
BAD_INPUT = (BadChunkError, LayoutMismatchError, ConfigError)
COUNTER_NAMES = ("lookups", "lookup_timeouts", "loads", "load_timeouts", "saves", "save_timeouts", "failures",
                 "stats", "stat_timeouts", "skipped_breaker_open", "dropped_save_chunks", "unsaved_chunks",
                 "breaker_opened")


@dataclass(frozen=True, slots=True)
class Guarded(Generic[T]):
    """A budgeted call's answer; `pending` is the still-running call when the deadline passed on a worker
    thread (embedded store; None otherwise: the daemon's client stops at its deadline)."""

    value: T
    pending: Future[Any] | None = None


class LateCall(Exception):
    """Raised by `_within` when a call on a worker thread ran past its budget; it still runs (`pending`)."""

    def __init__(self, pending: Future[Any]) -> None:
        super().__init__("no answer within the budget")
        self.pending = pending


def is_timeout(exc: BaseException) -> bool:
    """A call that ran out of its time (the socket's deadline), rather than one refused or dropped."""
    return isinstance(exc, TimeoutError) or isinstance(exc.__cause__, TimeoutError)


class EngineStore(ABC):
    """The engine side's store. Subclasses implement the raw calls (which raise on any failure) and `_within`."""

    layout: KVLayout
    root_key: bytes

    def __init__(self, deadlines: Deadlines, name: str) -> None:
        self.deadlines, self.name = deadlines, name
        self.breaker = Breaker(f"kvstore {name}", failures=deadlines.breaker_failures if deadlines.breaker else 1 << 62,
                               cooldown_s=deadlines.breaker_cooldown_s, opens_on_timeout=deadlines.breaker)
        self._counters_lock = threading.Lock()
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        self._saves = SaveQueue(self.put_many, deadlines.save_queue_chunks, name, self.count)

    def count(self, name: str, n: int = 1) -> None:
        with self._counters_lock:
            self.counters[name] += n

    # ----- what a subclass provides ---------------------------------------------------------------
    @abstractmethod
    def _within(self, budget_s: float, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` ending within `budget_s`; raises what it raised, a timeout, or LateCall."""

    def _span(self, budget_s: float) -> AbstractContextManager[None]:
        """One deadline over every batch of a call (the daemon's client); nothing by default."""
        return contextlib.nullcontext()

    def _batches(self, n: int) -> list[range]:
        return [range(0, n)]

    def _check_keys(self, keys: Sequence[bytes]) -> list[bytes]:
        """Bad keys raise here (BadChunkError), before anything is asked of the store."""
        return [validate_key(k) for k in keys]

    def _check_put(self, keys: Sequence[bytes], chunks: Sequence[torch.Tensor]) -> tuple[list[bytes], list[torch.Tensor]]:
        """Bad input raises here, before anything is sent; the chunks as the batches take them."""
        return self._check_keys(keys), list(chunks)

    def _check_get(self, keys: Sequence[bytes], outs: Sequence[torch.Tensor]) -> tuple[list[bytes], list[torch.Tensor]]:
        return self._check_keys(keys), list(outs)

    @abstractmethod
    def _lookup_batch(self, keys: list[bytes]) -> int: ...

    @abstractmethod
    def _get_batch(self, keys: list[bytes], outs: list[torch.Tensor]) -> list[bool]: ...

    @abstractmethod
    def _put_batch(self, keys: list[bytes], chunks: list[torch.Tensor]) -> PutResult: ...

    @abstractmethod
    def _remove(self, key: bytes) -> bool: ...

    @abstractmethod
    def _stats(self) -> dict[str, Any]: ...

    @abstractmethod
    def _flush(self, timeout_s: float | None) -> bool: ...

    @abstractmethod
    def _close(self) -> None: ...

    @abstractmethod
    def chunk_keys(self, token_ids: TokenIds, scope: KeyScope | None = None) -> list[ChunkKey]: ...

    @abstractmethod
    def empty_chunk(self) -> torch.Tensor: ...

    # ----- the failure rule ---------------------------------------------------------------------
    def _call(self, what: str, kind: CallKind, miss: Callable[[str], T], fn: Callable[..., T], *args: object,
              budget_s: float | None = None) -> Guarded[T]:
        """`fn(*args)` within the kind's budget, through the breaker; any failure but bad input is `miss(why)`."""
        self.count(what + "s")
        if not self.breaker.allow():
            self.count("skipped_breaker_open")
            return Guarded(miss(f"kvstore {self.name}: breaker open (last failure: {self.breaker.last_failure})"))
        budget = self.deadlines.budget_s(kind) if budget_s is None else budget_s
        try:
            value = self._within(budget, fn, *args)
        except LateCall as late:
            why = f"no answer within {kind.value}_timeout_s={budget:g}"
            self._failed(what, why, timed_out=True)
            return Guarded(miss(why), pending=late.pending)
        except BAD_INPUT:
            self.breaker.record(True)
            raise
        except (KVStoreError, OSError) as exc:
            timed_out = is_timeout(exc)
            why = f"no answer within {kind.value}_timeout_s={budget:g} ({exc})" if timed_out else str(exc)
            if isinstance(exc, TierFullError):
                self.breaker.record(True)  # it answered: no room now, which comes back in seconds
            else:
                self._failed(what, why or type(exc).__name__, timed_out=timed_out)
            return Guarded(miss(why))
        self.breaker.record(True)
        return Guarded(value)

    def _failed(self, what: str, why: str, *, timed_out: bool) -> None:
        self.count("failures")
        if timed_out:
            self.count(what + "_timeouts")
        opened = self.breaker.times_opened
        self.breaker.record(False, f"{what}: {why}", timed_out=timed_out)
        if self.breaker.times_opened != opened:
            self.count("breaker_opened")

    # ----- the store's calls ----------------------------------------------------------------------
    def lookup(self, token_ids: TokenIds, scope: KeyScope | None = None) -> int:
        return self.lookup_keys(self.chunk_keys(token_ids, scope)) * self.layout.chunk_tokens

    def lookup_keys(self, keys: Sequence[bytes]) -> int:
        """Leading chunks of `keys` held by the store (0 from the first failure on)."""
        keys = self._check_keys(keys)
        hits = 0
        with self._span(self.deadlines.lookup_timeout_s):
            for batch in self._batches(len(keys)):
                part = keys[batch.start:batch.stop]
                found = self._call("lookup", CallKind.LOOKUP, lambda why: 0, self._lookup_batch, part).value
                hits += found
                if found < len(part):
                    break
        return hits

    def contains(self, key: bytes) -> bool:
        return self.lookup_keys([key]) == 1

    def get_guarded(self, keys: Sequence[bytes], outs: Sequence[torch.Tensor]) -> Guarded[list[bool]]:
        """`get_many` within the load budget; while `pending` runs, `outs` belong to it."""
        keys, outs = self._check_get(keys, outs)
        found: list[bool] = []
        pending = None
        with self._span(self.deadlines.load_timeout_s):
            for batch in self._batches(len(keys)):
                n = len(batch)
                answer = self._call("load", CallKind.LOAD, lambda why, n=n: [False] * n, self._get_batch,  # type: ignore[misc]
                                    keys[batch.start:batch.stop], outs[batch.start:batch.stop])
                found += answer.value
                pending = pending or answer.pending
        return Guarded(found, pending)

    def get_many(self, keys: Sequence[bytes], outs: Sequence[torch.Tensor]) -> list[bool]:
        """Fill each out (the layout's chunk shape); False is a miss (also when the store fails or is late)."""
        return self.get_guarded(keys, outs).value

    def get(self, key: bytes, out: torch.Tensor) -> bool:
        return self.get_many([key], [out])[0]

    def put_guarded(self, keys: Sequence[bytes], chunks: Sequence[torch.Tensor]) -> Guarded[PutResult]:
        """`put_many` within the save budget; while `pending` runs, `chunks` belong to it."""
        keys, chunks = self._check_put(keys, chunks)
        result = PutResult()
        pending = None
        with self._span(self.deadlines.save_timeout_s):
            for batch in self._batches(len(keys)):
                part = keys[batch.start:batch.stop]
                answer = self._call("save", CallKind.SAVE, lambda why, part=part: _unsaved(part, why),  # type: ignore[misc]
                                    self._put_batch, part, chunks[batch.start:batch.stop])
                result.merge(answer.value)
                pending = pending or answer.pending
        return Guarded(result, pending)

    def put_many(self, keys: Sequence[bytes], chunks: Sequence[torch.Tensor]) -> PutResult:
        """Store chunks; a failure names each chunk in `not_stored` with the reason."""
        return self.put_guarded(keys, chunks).value

    def put(self, key: bytes, chunk: torch.Tensor) -> PutResult:
        return self.put_many([key], [chunk])

    def remove(self, key: bytes) -> bool:
        """True when the store removed the chunk; False when it held none or could not answer."""
        key = self._check_keys([key])[0]
        return bool(self._call("save", CallKind.SAVE, lambda why: False, self._remove, key).value)

    def stats(self) -> dict[str, Any]:
        """The store's stats within the control budget; raises TierIOError when it does not answer."""
        reasons: list[str] = []
        answer = self._call("stat", CallKind.CONTROL, lambda why: reasons.append(why), self._stats)
        if answer.value is None:
            raise TierIOError(f"kvstore {self.name}: no stats: {reasons[0] if reasons else 'no answer'}")
        return dict(answer.value)

    # ----- saves off the engine's path ------------------------------------------------------------
    def save_async(self, keys: Sequence[bytes], chunks: Sequence[torch.Tensor]) -> int:
        """Queue chunks for saving; returns how many were queued (the rest were dropped, counted)."""
        return self._saves.offer(list(keys), list(chunks))

    def wait_saves(self) -> None:
        """Block until every queued save has been handed to the store (tests and benches)."""
        self._saves.join()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for the queued saves, then for the store's own lower-tier writes (within the save budget)."""
        self.wait_saves()
        budget = self.deadlines.save_timeout_s if timeout_s is None else timeout_s
        return bool(self._call("save", CallKind.SAVE, lambda why: False, self._flush, timeout_s, budget_s=budget).value)

    def close(self) -> None:
        self._saves.close(self.deadlines.save_timeout_s * 2)
        self._close()

    def __enter__(self) -> EngineStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unsaved(keys: list[bytes], why: str) -> PutResult:
    return PutResult(not_stored=dict.fromkeys(keys, f"not stored: {why}"))
