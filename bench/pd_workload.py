"""The mixed workload of `kvstore bench pd`: short prompts with long answers decoding while long prompts
with short answers arrive, each request streamed so every token is timed.

    t=0 .. : `num_short` short requests, `short_gap_s` apart      (decode-heavy: TPOT is what they feel)
    t=long_start_s .. : `num_long` long prompts, `long_gap_s` apart (prefill-heavy: TTFT is what they feel)

On one colocated server a long prompt's prefill shares the engine's steps with the decodes under way and
stretches their inter-token gaps; disaggregated, it runs on the prefill instance.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass

import httpx

from bench.serving_client import percentile
from bench.serving_workload import VOCAB_HIGH, VOCAB_LOW
from bench.vllm_server import Completion, stream_completion

SHORT, LONG = "short", "long"


@dataclass(frozen=True, slots=True, kw_only=True)
class MixedWorkload:
    num_short: int
    short_tokens: int
    short_answer_tokens: int
    short_gap_s: float
    num_long: int
    long_tokens: int
    long_answer_tokens: int
    long_start_s: float
    long_gap_s: float

    @property
    def longest_request_tokens(self) -> int:
        return max(self.short_tokens + self.short_answer_tokens, self.long_tokens + self.long_answer_tokens)


@dataclass(frozen=True, slots=True)
class TimedRequest:
    kind: str
    prompt: list[int]
    max_tokens: int
    arrival_s: float


def make_requests(workload: MixedWorkload, seed: int) -> list[TimedRequest]:
    """The workload's requests, arrival order, prompts drawn with `seed` (distinct seeds: nothing shared)."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]

    w = workload
    short = [TimedRequest(SHORT, ids(w.short_tokens), w.short_answer_tokens, i * w.short_gap_s) for i in range(w.num_short)]
    long = [TimedRequest(LONG, ids(w.long_tokens), w.long_answer_tokens, w.long_start_s + i * w.long_gap_s)
            for i in range(w.num_long)]
    return sorted(short + long, key=lambda r: r.arrival_s)


def drive(url: str, requests: list[TimedRequest]) -> list[Completion | None]:
    """Send each request at its arrival time (streamed); the completions in request order, None for a failure."""

    async def one(client: httpx.AsyncClient, request: TimedRequest, start: float) -> Completion | None:
        await asyncio.sleep(max(0.0, start + request.arrival_s - time.perf_counter()))
        try:
            return await stream_completion(client, request.prompt, request.max_tokens)
        except (httpx.HTTPError, RuntimeError):
            return None

    async def run() -> list[Completion | None]:
        limits = httpx.Limits(max_connections=len(requests) + 4)
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800.0), limits=limits) as client:
            start = time.perf_counter()
            return list(await asyncio.gather(*(one(client, r, start) for r in requests)))

    return asyncio.run(run())


def summarize(requests: list[TimedRequest], done: list[Completion | None]) -> dict[str, float]:
    """TTFT of each kind (mean, p90), TPOT and the longest inter-token gap of the short requests, failures."""
    figures: dict[str, float] = {"failed": float(sum(c is None for c in done))}
    for kind in (SHORT, LONG):
        completions = [c for r, c in zip(requests, done, strict=True) if r.kind == kind and c is not None]
        ttfts = sorted(c.ttft_s for c in completions) or [float("nan")]
        figures[f"{kind}.ttft_mean"] = statistics.fmean(ttfts)
        figures[f"{kind}.ttft_p90"] = percentile(ttfts, 90)
        if kind == SHORT:
            tpots = sorted(c.tpot_s for c in completions) or [float("nan")]
            figures[f"{kind}.tpot_mean"] = statistics.fmean(tpots)
            figures[f"{kind}.tpot_p90"] = percentile(tpots, 90)
            figures[f"{kind}.itl_max"] = max((max(_gaps(c), default=0.0) for c in completions), default=float("nan"))
    return figures


def _gaps(completion: Completion) -> list[float]:
    times = completion.token_times_s
    return [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
