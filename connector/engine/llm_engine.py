"""`LLMEngine`: scheduler + model runner + sampler + (optional) store connector; `step()`, `generate()`, `replay()`.

With a store, saves leave the step through a `BackgroundSaver` (saver.py): the step that produces a
token only pins the pages of its newly full chunks and queues them; loads stay on the step (the
tokens need them)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from connector.engine.block_pool import BlockPool
from connector.engine.metrics import RunMetrics
from connector.engine.model import ModelConfig
from connector.engine.model_runner import ModelRunner, StepInput
from connector.engine.sampler import Sampler
from connector.engine.saver import BackgroundSaver
from connector.engine.scheduler import LoadPlan, Scheduler, SchedulerConfig, SchedulerOutput
from connector.engine.sequence import SamplingParams
from connector.engine.sequence import Sequence as EngineSequence
from connector.kv_connector import KVConnector
from kvstore.errors import ConfigError
from kvstore.types import ChunkStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Engine sizes: model, KV pages (page_size tokens each), batching and the device."""

    model: ModelConfig = field(default_factory=ModelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    page_size: int = 16
    num_blocks: int = 256
    device: str = "cpu"
    record_logits: bool = False  # keep each sampled token's logits (tests compare them with transformers)

    def __post_init__(self) -> None:
        if self.page_size < 1 or self.num_blocks < 1:
            raise ConfigError(f"page_size and num_blocks must be >= 1, got {self.page_size}, {self.num_blocks}")


@dataclass(frozen=True, slots=True)
class TimedRequest:
    """A request of a replayed workload: arrival offset from the start of the run."""

    arrival_s: float
    prompt_token_ids: list[int]
    sampling: SamplingParams


class LLMEngine:
    """A small real engine. With a `connector`, prefixes come from the store and full chunks go to it."""

    def __init__(self, config: EngineConfig, connector: KVConnector | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.connector = connector
        self.clock = clock
        self.pool = BlockPool(config.num_blocks, config.page_size)
        self.scheduler = Scheduler(config.scheduler, self.pool, connector, clock)
        self.runner = ModelRunner(config.model, config.num_blocks, config.page_size, config.device)
        self.sampler = Sampler()
        self.saver = BackgroundSaver(connector, self.pool, self.runner.kv_cache) if connector is not None else None
        self.logits: dict[str, list[torch.Tensor]] = {}
        self.finished: list[EngineSequence] = []
        self.last_num_tokens = 0  # tokens fed by the latest step (0: nothing was schedulable)
        self.num_iterations = 0  # steps that ran the model
        self.num_seq_iterations = 0  # sum over those steps of the sequences in the batch

    @classmethod
    def with_store(cls, config: EngineConfig, store: ChunkStore,
                   clock: Callable[[], float] = time.monotonic) -> LLMEngine:
        return cls(config, KVConnector(store, config.page_size, scope=config.model.identity(store.layout).scope()),
                   clock)

    def add_request(self, prompt_token_ids: Sequence[int], sampling: SamplingParams | None = None, *,
                    arrival_time: float | None = None, request_id: str = "") -> EngineSequence:
        seq = EngineSequence(list(prompt_token_ids), sampling or SamplingParams(),
                             arrival_time=self.clock() if arrival_time is None else arrival_time,
                             request_id=request_id, page_size=self.config.page_size)
        self.scheduler.add(seq)
        return seq

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[EngineSequence]:
        """One iteration: schedule, save swapped-out KV, load prefixes, forward, sample. Returns finished ones."""
        if self.saver is not None:
            self.saver.release_done()  # pages of saves that finished are the pool's again
        out = self.scheduler.schedule()
        self._swap_out(out)
        self._load(out.loads)
        inputs = [StepInput(seq, seq.num_computed_tokens, min(n, seq.num_remaining_tokens))
                  for seq, n in out.num_scheduled_tokens.items()]
        self.last_num_tokens = sum(item.num_tokens for item in inputs)
        if not inputs:
            return []
        self.num_iterations += 1
        self.num_seq_iterations += len(inputs)
        logits = self.runner.execute(inputs)
        now = self.clock()
        done = []
        for item, row in zip(inputs, logits, strict=True):
            if self._advance(item, row, now):
                done.append(item.seq)
        self.finished.extend(done)
        return done

    def _advance(self, item: StepInput, logits: torch.Tensor, now: float) -> bool:
        seq = item.seq
        seq.num_computed_tokens += item.num_tokens
        self.scheduler.commit(seq)
        if seq.num_computed_tokens == seq.num_tokens:
            if self.config.record_logits:
                self.logits.setdefault(seq.request_id, []).append(logits.clone())
            seq.append_token(self.sampler.sample(logits, seq.sampling, seq.request_id), now)
        self._save(seq)
        if not seq.is_finished_by_params:
            return False
        seq.finish_time = now
        self.scheduler.finish(seq)
        self.sampler.forget(seq.request_id)
        return True

    def _save(self, seq: EngineSequence) -> None:
        if self.saver is None:
            return
        full = seq.num_computed_tokens // self.saver.connector.chunk_tokens
        if full > seq.num_saved_chunks:
            self.saver.submit(seq.token_ids, seq.block_ids, num_tokens=seq.num_computed_tokens,
                              first_chunk=seq.num_saved_chunks)
            seq.num_saved_chunks = full

    def wait_for_save(self) -> None:
        """Wait until every save queued so far is in the store."""
        if self.saver is not None:
            self.saver.drain()
        if self.connector is not None:
            self.connector.wait_for_save()

    def close(self) -> None:
        """Finish queued saves and stop the saver thread (the store stays open: the caller owns it)."""
        if self.saver is not None:
            self.saver.close()
            self.saver = None
        if self.connector is not None:
            self.connector.wait_for_save()

    def _swap_out(self, out: SchedulerOutput) -> None:
        assert self.connector is not None or not out.swap_outs
        for swap in out.swap_outs:
            self.connector.save(swap.token_ids, swap.block_ids, self.runner.kv_cache,  # type: ignore[union-attr]
                                num_tokens=swap.num_tokens, first_chunk=swap.first_chunk)

    def _load(self, plans: list[LoadPlan]) -> None:
        if not plans:
            return
        assert self.connector is not None
        handles = [self.connector.start_load(p.seq.token_ids, p.seq.block_ids, self.runner.kv_cache,
                                             start_token=p.start_token, end_token=p.end_token) for p in plans]
        for plan, handle in zip(plans, handles, strict=True):
            loaded = self.connector.wait_for_load(handle)
            seq = plan.seq
            seq.num_computed_tokens = plan.start_token + loaded
            seq.num_store_hit_tokens += loaded
            seq.num_saved_chunks = max(seq.num_saved_chunks, seq.num_computed_tokens // self.connector.chunk_tokens)

    def _idle_until(self, when: float) -> None:
        skip_to = getattr(self.clock, "skip_to", None)  # a virtual clock jumps; a wall clock is waited on
        if skip_to is not None:
            skip_to(when)
        else:
            time.sleep(max(0.0, min(when - self.clock(), 0.05)))

    def generate(self, prompts: Iterable[Sequence[int]], sampling: SamplingParams | None = None) -> list[list[int]]:
        """Run prompts to completion (all arrive now); returns each one's output token ids, in order."""
        seqs = [self.add_request(p, sampling) for p in prompts]
        while self.has_unfinished():
            self.step()
        self.wait_for_save()
        return [list(s.output_token_ids) for s in seqs]

    def replay(self, requests: Sequence[TimedRequest], on_finish: Callable[[EngineSequence], None] | None = None) -> RunMetrics:
        """Feed requests at their arrival offsets (real time) and run until all finish."""
        pending = sorted(requests, key=lambda r: r.arrival_s)
        start = self.clock()
        metrics = RunMetrics()
        iterations, seq_iterations = self.num_iterations, self.num_seq_iterations
        i = 0
        while i < len(pending) or self.has_unfinished():
            now = self.clock() - start
            while i < len(pending) and pending[i].arrival_s <= now:
                r = pending[i]
                self.add_request(r.prompt_token_ids, r.sampling, arrival_time=start + r.arrival_s)
                i += 1
            if not self.has_unfinished():
                self._idle_until(start + pending[i].arrival_s)
                continue
            for seq in self.step():
                metrics.add([seq])
                if on_finish is not None:
                    on_finish(seq)
            if self.last_num_tokens == 0:  # e.g. dynamic batching waiting for its batch: do not spin
                self._idle_until(min(self.clock() + 0.001, start + pending[i].arrival_s) if i < len(pending)
                                 else self.clock() + 0.001)
        metrics.wall_s = self.clock() - start
        metrics.iterations = self.num_iterations - iterations
        metrics.seq_iterations = self.num_seq_iterations - seq_iterations
        self.wait_for_save()
        return metrics
