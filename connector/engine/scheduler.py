"""`Scheduler`: rebuilds the batch every iteration: decodes first, chunked prefill under a token budget,
admission only when pages fit, preemption by recompute or by swap through the store."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from connector.engine.block_pool import BlockPool
from connector.engine.sequence import Sequence, SequenceStatus
from kvstore.errors import ConfigError

if TYPE_CHECKING:
    from connector.kv_connector import KVConnector
from connector.engine.scheduling.registry import make_scheduling_policy

logger = logging.getLogger(__name__)

BATCHING_MODES = ("continuous", "static", "dynamic")
PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """Batching knobs.

    mode: "continuous" admits every iteration; "static" admits a batch only when the previous
    one has fully finished; "dynamic" is static but waits for max_num_seqs requests or
    `max_batch_wait_s` after the oldest arrival, whichever first (Triton-style batching).
    """

    max_num_batched_tokens: int = 512
    max_num_seqs: int = 16
    mode: str = "continuous"
    preemption_mode: str = "recompute"
    max_batch_wait_s: float = 0.05
    policy: str = "fcfs"
    policy_options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                f"need 1 <= max_num_seqs ({self.max_num_seqs}) <= max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) so decodes never use the whole budget"
            )
        if self.mode not in BATCHING_MODES:
            raise ConfigError(f"unknown batching mode {self.mode!r}; valid: {', '.join(BATCHING_MODES)}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ConfigError(f"unknown preemption mode {self.preemption_mode!r}; valid: {', '.join(PREEMPTION_MODES)}")


@dataclass(slots=True)
class LoadPlan:
    """Tokens [start_token, end_token) of `seq` to load from the store into its pages (chunk aligned)."""

    seq: Sequence
    start_token: int
    end_token: int


@dataclass(slots=True)
class SwapOut:
    """A preempted sequence's computed KV to save through the store before its pages are reused."""

    token_ids: list[int]
    block_ids: list[int]
    num_tokens: int
    first_chunk: int


@dataclass(slots=True)
class SchedulerOutput:
    """One iteration's batch: tokens to feed per sequence, loads to do first, swaps to save first."""

    num_scheduled_tokens: dict[Sequence, int] = field(default_factory=dict)
    loads: list[LoadPlan] = field(default_factory=list)
    swap_outs: list[SwapOut] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


class Scheduler:
    """Owns the waiting and running queues and the block pool's bookkeeping; moves no bytes.

    `connector` (optional) answers the scheduler-side question "how many tokens of this request
    does the store hold" (`get_num_matched_tokens`) and fixes `chunk_tokens`.
    """

    def __init__(self, config: SchedulerConfig, pool: BlockPool, connector: KVConnector | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.pool = pool
        self.connector = connector
        self.clock = clock
        self.policy = make_scheduling_policy(config.policy, **dict(config.policy_options))
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """Build this iteration's batch (see the module docstring for the order)."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_decodes(out, budget)
        for seq in self.running:
            if seq not in out.num_scheduled_tokens and budget > 0:
                n = min(seq.num_remaining_tokens, budget)
                out.num_scheduled_tokens[seq] = n
                budget -= n
        if not out.preempted and self._may_admit():
            self._admit_waiting(out, budget)
        return out

    def _schedule_decodes(self, out: SchedulerOutput, budget: int) -> int:
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING or not seq.is_decoding:
                continue
            while not self._ensure_pages(seq):
                candidates = [s for s in self.running if s not in out.num_scheduled_tokens]
                victim = candidates[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status is SequenceStatus.RUNNING:
                out.num_scheduled_tokens[seq] = 1
                budget -= 1
        return budget

    def _ensure_pages(self, seq: Sequence) -> bool:
        """Give `seq` pages for all its tokens; False when the pool is out of free pages."""
        needed = -(-seq.num_tokens // self.pool.page_size) - len(seq.block_ids)
        if needed <= 0:
            return True
        if not self.pool.can_allocate(needed):
            return False
        seq.block_ids.extend(self.pool.allocate(needed))
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        if self.config.preemption_mode == "swap" and self.connector is not None:
            out.swap_outs.append(SwapOut(token_ids=seq.token_ids, block_ids=list(seq.block_ids),
                                         num_tokens=seq.num_computed_tokens, first_chunk=seq.num_saved_chunks))
        logger.debug("preempting %s (%s) at %d computed tokens", seq.request_id,
                     self.config.preemption_mode, seq.num_computed_tokens)
        self._release(seq)
        seq.num_computed_tokens = 0
        seq.num_cached_pages = 0
        seq.store_lookup = None  # its swap-out may add chunks the last lookup did not see
        seq.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(seq)
        out.num_scheduled_tokens.pop(seq, None)
        self.waiting.insert(0, seq)
        seq.status = SequenceStatus.WAITING

    def _release(self, seq: Sequence) -> None:
        self.pool.free(seq.block_ids)
        seq.block_ids = []
        if seq in self.running:
            self.running.remove(seq)

    def _may_admit(self) -> bool:
        mode = self.config.mode
        if mode == "continuous":
            return True
        if self.running or not self.waiting:
            return False
        if mode == "static":
            return True
        oldest = min(s.arrival_time for s in self.waiting)
        return len(self.waiting) >= self.config.max_num_seqs or self.clock() - oldest >= self.config.max_batch_wait_s

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        continuous = self.config.mode == "continuous"
        for seq in self.policy.order(self.waiting, self.clock()):
            if len(self.running) >= self.config.max_num_seqs or (continuous and budget <= 0):
                break
            expected = self._allocate_for_admission(seq, out)
            if expected is None:
                break  # pages do not fit: block admission (no skipping ahead of the policy's order)
            self.waiting.remove(seq)
            self.policy.on_admit(seq, self.waiting, self.clock())
            self.running.append(seq)
            seq.status = SequenceStatus.RUNNING
            if seq.admit_time is None:
                seq.admit_time = self.clock()
            n = min(seq.num_tokens - expected, max(budget, 0))
            if n > 0:
                out.num_scheduled_tokens[seq] = n
                budget -= n

    def _allocate_for_admission(self, seq: Sequence, out: SchedulerOutput) -> int | None:
        """Reuse cached pages, plan store loads, allocate the rest; the tokens expected computed, or None."""
        page = self.pool.page_size
        max_hit_tokens = seq.num_tokens - 1  # the last token is always fed: its logits give the next one
        hits = self.pool.find_cached_prefix(seq.page_hashes[: max_hit_tokens // page])
        pool_tokens = len(hits) * page
        store_tokens = 0
        if self.connector is not None:
            chunk = self.connector.chunk_tokens
            store_tokens = self._store_hit_tokens(seq, max_hit_tokens)
            if store_tokens > pool_tokens:
                hits = hits[: (pool_tokens // chunk) * chunk // page]  # loads start on a chunk boundary
                pool_tokens = len(hits) * page
        num_new = -(-seq.num_tokens // page) - len(hits)
        if not self.pool.can_allocate(num_new, hits):
            return None
        self.pool.touch(hits)
        seq.block_ids = hits + self.pool.allocate(num_new)
        seq.num_computed_tokens = pool_tokens
        seq.num_cached_pages = len(hits)
        seq.num_pool_hit_tokens = max(seq.num_pool_hit_tokens, pool_tokens)
        if store_tokens > pool_tokens:
            out.loads.append(LoadPlan(seq=seq, start_token=pool_tokens, end_token=store_tokens))
            return store_tokens
        return pool_tokens

    def _store_hit_tokens(self, seq: Sequence, max_tokens: int) -> int:
        """The store's hit for `seq`, asked again only when its tokens changed or this engine stored chunks
        since: a request blocked on pages comes back to admission every step, and a lookup (hash the prompt,
        ask the store: a round trip to a sidecar) on every step sat on the path to every first token."""
        assert self.connector is not None
        state = (max_tokens, self.connector.num_saved_chunks)
        if seq.store_lookup is None or seq.store_lookup[0] != state:
            seq.store_lookup = (state, self.connector.get_num_matched_tokens(seq.token_ids, max_tokens=max_tokens))
        return seq.store_lookup[1]

    def commit(self, seq: Sequence) -> None:
        """Register `seq`'s newly full, computed pages in the pool's prefix cache."""
        num_full = min(seq.num_computed_tokens // self.pool.page_size, len(seq.page_hashes))
        hashes = seq.page_hashes
        for i in range(seq.num_cached_pages, num_full):
            self.pool.cache_block(seq.block_ids[i], hashes[i])
        seq.num_cached_pages = max(seq.num_cached_pages, num_full)

    def finish(self, seq: Sequence) -> None:
        """Release a finished sequence's pages (they stay cached for prefix reuse until evicted)."""
        self._release(seq)
        seq.status = SequenceStatus.FINISHED
        self.policy.on_remove(seq)
