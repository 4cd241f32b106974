"""Latency and throughput metrics per request and per run: TTFT, inter-token latency, e2e, P50/P90/P99, hit rate."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from connector.engine.sequence import Sequence as EngineSequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated q-th percentile (0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestMetrics:
    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    ttft_s: float
    itl_s: tuple[float, ...]
    e2e_s: float
    wait_s: float
    pool_hit_tokens: int
    store_hit_tokens: int
    num_preemptions: int

    @classmethod
    def from_sequence(cls, seq: EngineSequence) -> RequestMetrics:
        times = seq.token_times
        first = seq.first_token_time if seq.first_token_time is not None else math.nan
        end = seq.finish_time if seq.finish_time is not None else (times[-1] if times else math.nan)
        return cls(
            request_id=seq.request_id, num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=len(seq.output_token_ids), ttft_s=first - seq.arrival_time,
            itl_s=tuple(b - a for a, b in itertools.pairwise(times)), e2e_s=end - seq.arrival_time,
            wait_s=(seq.admit_time if seq.admit_time is not None else math.nan) - seq.arrival_time,
            pool_hit_tokens=seq.num_pool_hit_tokens, store_hit_tokens=seq.num_store_hit_tokens,
            num_preemptions=seq.num_preemptions,
        )


@dataclass(slots=True)
class RunMetrics:
    """Aggregates over one run; `summary()` is a flat dict of the figures the demo and bench print."""

    requests: list[RequestMetrics] = field(default_factory=list)
    wall_s: float = 0.0
    iterations: int = 0  # engine steps that ran the model
    seq_iterations: int = 0  # sequences summed over those steps (/ iterations = mean batch size)

    def add(self, seqs: Iterable[EngineSequence]) -> None:
        self.requests.extend(RequestMetrics.from_sequence(s) for s in seqs)

    def summary(self) -> dict[str, float]:
        reqs = self.requests
        ttft = [r.ttft_s for r in reqs]
        itl = [x for r in reqs for x in r.itl_s]
        e2e = [r.e2e_s for r in reqs]
        prompt = sum(r.num_prompt_tokens for r in reqs)
        output = sum(r.num_output_tokens for r in reqs)
        out: dict[str, float] = {"requests": len(reqs), "wall_s": self.wall_s, "prompt_tokens": prompt, "output_tokens": output}
        for name, values in (("ttft", ttft), ("itl", itl), ("e2e", e2e)):
            out[f"{name}_mean_s"] = sum(values) / len(values) if values else math.nan
            for q in (50, 90, 99):
                out[f"{name}_p{q}_s"] = percentile(values, q)
        wall = self.wall_s if self.wall_s > 0 else math.nan
        out["output_tokens_per_s"] = output / wall
        out["total_tokens_per_s"] = (prompt + output) / wall
        out["kv_hit_rate"] = sum(r.pool_hit_tokens + r.store_hit_tokens for r in reqs) / prompt if prompt else 0.0
        out["store_hit_rate"] = sum(r.store_hit_tokens for r in reqs) / prompt if prompt else 0.0
        out["preemptions"] = sum(r.num_preemptions for r in reqs)
        out["max_wait_s"] = max((r.wait_s for r in reqs), default=math.nan)
        out["iterations"] = self.iterations
        out["mean_batch_seqs"] = self.seq_iterations / self.iterations if self.iterations else 0.0
        return out


class ComputeClock:
    """Seconds of this thread's CPU time, plus idle gaps skipped over (`skip_to`).

    Replaying with this clock measures what the engine itself spends, untouched by other
    processes on a shared machine: arrivals still pace the run, but waiting costs nothing.
    Background threads (store writers) are not counted: use the wall clock when they matter.
    """

    def __init__(self) -> None:
        self._offset = -time.thread_time()

    def __call__(self) -> float:
        return time.thread_time() + self._offset

    def skip_to(self, when: float) -> None:
        now = self()
        if when > now:
            self._offset += when - now
