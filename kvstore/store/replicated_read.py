"""Multi-chunk reads spread over every replica tier, handed back in prefix order.

Each replica level runs `readers_per_level` readers. A reader claims the next unclaimed chunk
(lowest index first) that its level holds, so an idle level always takes the next chunk and the
aggregate bandwidth of all levels serves one request. A chunk that fails on one level goes back
to the pool for the levels that remain; results are awaited strictly in index (prefix) order.

    chunk:    0    1    2    3    4    5
    nvme:    [r]       [r]  [r]             (claims as it frees up)
    pfs:          [r]            [r]  [r]

Errors: a KVStoreError or OSError from a read means this level cannot serve the chunk (logged,
then the next level tries). Any other exception (a bug, KeyboardInterrupt, SystemExit) stops the
read: readers claim nothing more, and `results()` raises it in the caller once they are idle.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from kvstore.errors import KVStoreError

logger = logging.getLogger(__name__)
MISS_ERRORS = (KVStoreError, OSError)  # a level cannot serve this chunk now: try another one


@dataclass(slots=True)
class ReadJob:
    key: bytes
    levels: set[int]  # levels that may still serve it
    claimed: bool = False
    ok: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class ReplicatedRead:
    """One spread read. `read_fn(level, job_index) -> bool` does the I/O; False means try another level."""

    def __init__(self, jobs: Sequence[ReadJob], read_fn: Callable[[int, int], bool], pool: Executor,
                 readers_per_level: int) -> None:
        self.jobs = list(jobs)
        self._read_fn = read_fn
        self._pool = pool
        self._readers_per_level = readers_per_level
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a reader exits
        self._active: dict[int, int] = {}  # level -> running readers
        self._cursor: dict[int, int] = {}
        self._error: BaseException | None = None  # an exception that is not a miss: re-raised by results()

    def start(self) -> ReplicatedRead:
        levels = sorted({level for job in self.jobs for level in job.levels})
        for job in self.jobs:
            if not job.levels:
                job.done.set()
        with self._lock:
            for level in levels:
                for _ in range(self._readers_per_level):
                    self._spawn(level)
        return self

    def _spawn(self, level: int) -> None:
        self._active[level] = self._active.get(level, 0) + 1
        self._pool.submit(self._reader, level)

    def _claim(self, level: int) -> int | None:
        # The cursor skips the leading run of jobs this level can never take again.
        if self._error is not None:
            return None
        start = self._cursor.get(level, 0)
        contiguous = True
        for index in range(start, len(self.jobs)):
            job = self.jobs[index]
            finished = job.done.is_set() or level not in job.levels
            if finished:
                if contiguous:
                    self._cursor[level] = index + 1
                continue
            contiguous = False
            if not job.claimed:
                job.claimed = True
                return index
        return None

    def _reader(self, level: int) -> None:
        while True:
            with self._lock:
                index = self._claim(level)
                if index is None:
                    self._active[level] -= 1
                    self._idle.notify_all()
                    return
            try:
                ok = self._read_fn(level, index)
            except MISS_ERRORS as exc:
                logger.warning("replicated read of chunk %s from level %d failed: %s; trying other levels",
                               self.jobs[index].key.hex(), level, exc)
                ok = False
            except BaseException as exc:  # not a miss: hand it to the caller, stop reading
                self._fail(exc)
                continue
            self._finish(level, index, ok)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc
            for job in self.jobs:
                job.done.set()

    def _finish(self, level: int, index: int, ok: bool) -> None:
        job = self.jobs[index]
        with self._lock:
            job.claimed = False
            job.levels.discard(level)
            if ok or not job.levels:
                job.ok = ok
                job.done.set()
                return
            for other in job.levels:  # someone must still serve it
                if self._active.get(other, 0) == 0:
                    self._cursor[other] = min(self._cursor.get(other, 0), index)
                    self._spawn(other)

    def results(self) -> Iterator[tuple[int, bool]]:
        """(index, ok) in prefix order, each as soon as it and all before it are done."""
        for index, job in enumerate(self.jobs):
            job.done.wait()
            if self._error is not None:
                self._raise_when_idle()
            yield index, job.ok

    def _raise_when_idle(self) -> None:
        """Wait until no reader still writes into a caller's buffer, then raise the stored error."""
        with self._idle:
            while any(self._active.values()):
                self._idle.wait()
        assert self._error is not None
        raise self._error
