"""One round of `kvstore bench async_load`: running requests streamed over the OpenAI API, with or without one
request that loads a long prefix from kvstore while they decode; their inter-token times.

    quiet round   B background requests (short prompts, nothing to load) decode T tokens each
    load round    the same, and once every one of them has its first tokens, a request whose prompt is
                  the long stored prefix (+ a fresh suffix) arrives: vLLM loads the prefix from kvstore

The figures of a round: the background requests' TPOT (mean over their whole decode), their mean and
largest inter-token gap within the load's window (from sending the long request to its first token;
a quiet round is measured over the window of the load round it is paired with), and the long request's TTFT.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from bench.vllm_server import Completion, stream_completion


@dataclass(frozen=True, slots=True)
class Round:
    """What one round measured; `window` is the load's (start, end) from the round's start, in s."""

    background: list[Completion]
    window: tuple[float, float] | None
    load: Completion | None


def run_round(url: str, backgrounds: Sequence[Sequence[int]], answer_tokens: int, load_prompt: Sequence[int] | None,
              after_tokens: int) -> Round:
    """Send `backgrounds` at once; with `load_prompt`, send it once each has `after_tokens` tokens."""

    async def run() -> Round:
        started = asyncio.Event()
        counts = [0] * len(backgrounds)

        def heard(i: int, n: int) -> None:
            counts[i] = n
            if min(counts) >= after_tokens:
                started.set()

        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(900.0)) as client:
            zero = time.perf_counter()
            tasks = [asyncio.create_task(stream_completion(client, p, answer_tokens,
                                                           on_token=lambda n, i=i: heard(i, n)))  # type: ignore[misc]
                     for i, p in enumerate(backgrounds)]
            load, window = None, None
            if load_prompt is not None:
                await started.wait()
                sent = time.perf_counter() - zero
                load = await stream_completion(client, load_prompt, 2)
                window = (sent, sent + load.ttft_s)
            return Round(list(await asyncio.gather(*tasks)), window, load)

    return asyncio.run(run())


def tpot_s(round_: Round) -> float:
    """The background requests' mean TPOT (each over its whole decode)."""
    return statistics.fmean(c.tpot_s for c in round_.background)


def window_gaps_s(round_: Round, window: tuple[float, float]) -> list[float]:
    """Inter-token gaps of the background requests that end within `window` (the round's own clock: the
    background requests were sent at its start, so their token times are on it)."""
    start, end = window
    gaps = []
    for completion in round_.background:
        times = completion.token_times_s
        gaps += [b - a for a, b in zip(times, times[1:], strict=False) if start <= b <= end]
    return gaps
