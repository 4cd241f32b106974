"""Drive a `vllm serve` with `kvstore bench serving`'s sessions over the OpenAI API, and sum up what came back.

Every session runs as its own asyncio task: a turn is sent at its trace arrival time (or when the previous
answer is in, if later), streamed, and its answer appended to the session's history for the next turn.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import httpx

from bench.serving_workload import Session
from bench.vllm_server import Completion, stream_completion


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run of the workload: every completed turn (`turns[i]` is completions[i]'s turn, 0 the first), the
    failed ones, the run's wall time, and each session's completed turns in order (`by_session`)."""

    completions: list[Completion]
    num_failed: int
    wall_s: float
    turns: list[int]
    by_session: list[list[Completion]] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """TTFT mean/p50/p90/p99 (and the mean of first turns and of later ones) and TPOT mean (s), output
        throughput (tokens/s), hit tokens, failures."""
        ttfts = sorted(c.ttft_s for c in self.completions) or [float("nan")]
        first = [c.ttft_s for c, turn in zip(self.completions, self.turns, strict=True) if turn == 0]
        later = [c.ttft_s for c, turn in zip(self.completions, self.turns, strict=True) if turn > 0]
        return {"ttft_mean": statistics.fmean(ttfts), "ttft_p50": percentile(ttfts, 50),
                "ttft_first_turns": statistics.fmean(first) if first else float("nan"),
                "ttft_later_turns": statistics.fmean(later) if later else float("nan"),
                "ttft_p90": percentile(ttfts, 90), "ttft_p99": percentile(ttfts, 99),
                "tpot_mean": statistics.fmean(c.tpot_s for c in self.completions) if self.completions else 0.0,
                "throughput": sum(len(c.token_ids) for c in self.completions) / self.wall_s,
                "hit_tokens": float(sum(c.num_cached_tokens for c in self.completions)),
                "prompt_tokens": float(sum(c.num_prompt_tokens for c in self.completions)),
                "failed": float(self.num_failed)}


def percentile(sorted_values: list[float], pct: float) -> float:
    """Linear-interpolated percentile of already sorted values (numpy's default method)."""
    position = (len(sorted_values) - 1) * pct / 100
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def drive(url: str, sessions: list[Session], answer_tokens: int) -> RunResult:
    """Run every session against the server at `url`; the clock starts at the earliest first turn."""

    async def run() -> RunResult:
        limits = httpx.Limits(max_connections=len(sessions) + 4)
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800.0), limits=limits) as client:
            origin = min(s.arrivals_s[0] for s in sessions)
            start = time.perf_counter()
            outcomes = await asyncio.gather(*(run_session(client, s, answer_tokens, start - origin)
                                              for s in sessions))
            wall = time.perf_counter() - start
        done = [(turn, c) for completions, _ in outcomes for turn, c in enumerate(completions)]
        return RunResult([c for _, c in done], sum(failed for _, failed in outcomes), wall, [t for t, _ in done],
                         [completions for completions, _ in outcomes])

    return asyncio.run(run())


async def run_session(client: httpx.AsyncClient, session: Session, answer_tokens: int,
                      clock_zero: float) -> tuple[list[Completion], int]:
    """The session's turns in order; a failed turn ends the session (its later turns count as failed)."""
    history = list(session.context)
    done: list[Completion] = []
    for turn, (message, arrival) in enumerate(zip(session.messages, session.arrivals_s, strict=True)):
        await asyncio.sleep(max(0.0, clock_zero + arrival - time.perf_counter()))
        prompt = history + message
        try:
            completion = await stream_completion(client, prompt, answer_tokens)
        except (httpx.HTTPError, RuntimeError):
            return done, len(session.messages) - turn
        done.append(completion)
        history = prompt + completion.token_ids
    return done, 0
