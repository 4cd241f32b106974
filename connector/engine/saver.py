"""`BackgroundSaver`: the engine's saves to the store, off the step that produces tokens.

    engine thread (step k)                      saver thread (lower OS priority)
      _advance: new full chunks  ── pin pages ──> bounded queue (max_jobs) ──> gather pages, hash keys,
      next step: release_done() <── done queue <──────────────────────────── put into the store (waits)

A step only pins the pages of the chunks it completed (one more reference in the `BlockPool`, so a
finished or preempted sequence's pages are not reused before they are copied) and queues a job; the
gather, the chunk keys and the store's put run on the saver thread, which lowers its own scheduling
priority so that on a shared CPU the engine's forward passes come first. Pages are unpinned on the
engine thread (the pool is not thread-safe) at the start of the next step. A full queue blocks the
step until a job finishes (back-pressure, counted in `counters["waits"]`): the pinned pages and the
queued jobs stay bounded.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from dataclasses import dataclass

import torch

from connector.engine.block_pool import BlockPool
from connector.kv_connector import KVConnector
from kvstore.errors import ConfigError

logger = logging.getLogger(__name__)

SAVER_NICE = 10  # added to the saver thread's nice value (Linux: per thread); the engine keeps its own


@dataclass(frozen=True, slots=True)
class SaveJob:
    """Chunks [first_chunk, num_tokens // chunk_tokens) of a sequence; `pinned` are the pages held for it."""

    token_ids: list[int]
    block_ids: list[int]
    num_tokens: int
    first_chunk: int
    pinned: list[int]


class BackgroundSaver:
    """Queues an engine's saves and runs them on one thread (see the module docstring).

    Args:
        connector: the engine's connector; its `save` gathers and puts, `wait_for_save` waits for the put.
        pool: the engine's page pool (pins are references in it).
        kv_cache: the engine's paged KV cache the pages are gathered from.
        max_jobs: saves that may wait at once; a full queue blocks `submit`.
    """

    def __init__(self, connector: KVConnector, pool: BlockPool, kv_cache: torch.Tensor, *, max_jobs: int = 16) -> None:
        if max_jobs < 1:
            raise ConfigError(f"max_jobs must be >= 1, got {max_jobs}")
        self.connector = connector
        self.pool = pool
        self.kv_cache = kv_cache
        self._jobs: queue.Queue[SaveJob | None] = queue.Queue(max_jobs)
        self._done: queue.SimpleQueue[SaveJob] = queue.SimpleQueue()
        self.counters = {"jobs": 0, "waits": 0, "failed": 0}
        self._thread = threading.Thread(target=self._run, name="kv-saver", daemon=True)
        self._thread.start()

    def submit(self, token_ids: list[int], block_ids: list[int], *, num_tokens: int, first_chunk: int) -> None:
        """Pin the pages of the new chunks and queue their save (engine thread)."""
        pages = self.connector.pages_per_chunk
        last_chunk = num_tokens // self.connector.chunk_tokens
        pinned = block_ids[first_chunk * pages : last_chunk * pages]
        self.pool.touch(pinned)
        job = SaveJob(token_ids[:num_tokens], list(block_ids), num_tokens, first_chunk, pinned)
        self.release_done()
        self.counters["jobs"] += 1
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self.counters["waits"] += 1
            self._jobs.put(job)

    def release_done(self) -> None:
        """Unpin the pages of finished saves (engine thread)."""
        while True:
            try:
                job = self._done.get_nowait()
            except queue.Empty:
                return
            self.pool.free(job.pinned)

    def drain(self) -> None:
        """Wait until every queued save is in the store, then unpin (engine thread)."""
        self._jobs.join()
        self.release_done()

    def close(self) -> None:
        self.drain()
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        _lower_priority()
        while (job := self._jobs.get()) is not None:
            try:
                self.connector.save(job.token_ids, job.block_ids, self.kv_cache,
                                    num_tokens=job.num_tokens, first_chunk=job.first_chunk)
                self.connector.wait_for_save()
            except Exception:  # a failed save is a lost cache entry, never a failed request
                self.counters["failed"] += 1
                logger.exception("background save of %d tokens failed", job.num_tokens)
            finally:
                self._done.put(job)
                self._jobs.task_done()
        self._jobs.task_done()


def _lower_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + SAVER_NICE)
    except (AttributeError, OSError) as exc:  # not Linux, or not allowed: the saver still runs off the step
        logger.debug("saver thread keeps its priority: %s", exc)
