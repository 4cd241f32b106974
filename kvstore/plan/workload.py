"""Workloads for the planner: the parametric conversation model as a block-id trace, and trace statistics.

Every workload becomes a `kvstore.sim.trace.Trace` (timestamps in ms, chained block ids, head first),
so `kvstore.sim.replay` replays all of them the same way; trace files (Mooncake JSONL, Azure CSV
under its reuse model) are read by `kvstore.sim.trace_files`. Two requests share block i exactly when they
share the first (i+1) * block_tokens prompt tokens; a prompt's partly filled last block gets a
fresh id (it changes when the conversation grows), as in the Mooncake release.

Parametric model (`parametric_trace`): `sessions` conversations of `turns` turns, sent turn by
turn (every session's turn 1, then every session's turn 2, ...), one request each 1/rps s.
    turn 1 prompt = S shared system tokens + (prompt_tokens - S) new tokens, S = repeat_share * prompt_tokens
    turn k prompt = turn k-1 prompt + output_tokens (the answer) + (prompt_tokens - S) new tokens
The S-token system prompt is shared by every session; a session's turns share their prefixes.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from kvstore.errors import ConfigError
from kvstore.plan.inputs import WorkloadParams
from kvstore.sim.trace import Trace, TraceRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadStats:
    """Summary figures of a trace: rate, lengths and reuse."""

    num_requests: int
    duration_s: float
    rps: float
    mean_prompt_tokens: float
    num_accesses: int
    num_distinct_blocks: int
    block_tokens: int


def parametric_trace(params: WorkloadParams, *, block_tokens: int) -> Trace:
    """The synthetic conversation workload described in the module docstring."""
    system_tokens = round(params.repeat_share * params.prompt_tokens)
    new_tokens = params.prompt_tokens - system_tokens
    prompts = [0] * params.sessions
    requests: list[TraceRequest] = []
    partial = itertools.count(1 << 40)  # partial last blocks never repeat
    for turn in range(params.turns):
        for session in range(params.sessions):
            grow = params.output_tokens if turn else 0
            prompts[session] = (prompts[session] + grow + new_tokens) if turn else params.prompt_tokens
            blocks = _session_blocks(session, prompts[session], system_tokens, block_tokens, partial)
            timestamp_ms = len(requests) * 1000.0 / params.rps
            requests.append(TraceRequest(timestamp_ms, prompts[session], blocks))
    return Trace(f"parametric(rps={params.rps:g}, prompt={params.prompt_tokens}, out={params.output_tokens}, "
                 f"repeat={params.repeat_share:g}, sessions={params.sessions}, turns={params.turns})",
                 requests, block_tokens)


def _session_blocks(session: int, prompt: int, system_tokens: int, block_tokens: int,
                    partial: Iterator[int]) -> tuple[int, ...]:
    full = prompt // block_tokens
    system_blocks = system_tokens // block_tokens
    ids = [i if i < system_blocks else ((session + 1) << 20) + i for i in range(full)]
    if prompt % block_tokens:
        ids.append(next(partial))
    return tuple(ids)


def trace_stats(trace: Trace) -> WorkloadStats:
    requests = trace.requests
    if not requests:
        raise ConfigError(f"trace {trace.name} has no requests")
    duration_s = (requests[-1].timestamp - requests[0].timestamp) / 1000.0
    return WorkloadStats(
        num_requests=len(requests), duration_s=duration_s,
        rps=len(requests) / duration_s if duration_s > 0 else float(len(requests)),
        mean_prompt_tokens=sum(r.input_tokens for r in requests) / len(requests),
        num_accesses=trace.num_accesses, num_distinct_blocks=trace.num_distinct_blocks,
        block_tokens=trace.block_tokens)


def working_set(trace: Trace, block_bytes: int, num_windows: int = 12) -> list[dict[str, float]]:
    """Distinct blocks touched per time window, and cumulative, in blocks and bytes."""
    requests = trace.requests
    start, end = requests[0].timestamp, requests[-1].timestamp
    width = max((end - start) / num_windows, 1e-9)
    windows: list[set[int]] = [set() for _ in range(num_windows)]
    for r in requests:
        windows[min(num_windows - 1, int((r.timestamp - start) / width))].update(r.block_ids)
    seen: set[int] = set()
    out = []
    for i, blocks in enumerate(windows):
        seen |= blocks
        out.append({"end_s": (i + 1) * width / 1000.0, "window_blocks": len(blocks),
                    "window_bytes": len(blocks) * block_bytes, "cumulative_bytes": len(seen) * block_bytes})
    return out
