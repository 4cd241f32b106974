"""Predicted time to first token with and without the store (prefill only, no queueing).

A request of P prompt tokens whose first h_0 P tokens sit in tier 0, the next h_1 P in tier 1, ...
takes, per cached segment [a, b) from tier k, min(load from k, recompute of [a, b)) (an engine
recomputes when that is faster), then recomputes the rest:

    TTFT = sum_k min((b - a) * bytes_per_token / bw_k, (F(b) - F(a)) / flops_s)  +  (F(P) - F(H P)) / flops_s

with F(T) = prefill_flops(T) and H = sum_k h_k. Without the store only the GPU prefix cache helps.
Figures are means over the workload's requests (a sample of at most 1,000 prompt lengths), each
request split over the tiers by the trace-wide shares.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kvstore.plan.bandwidth import TierSpec, load_s
from kvstore.plan.inputs import HardwareSpec, ModelSpec
from kvstore.plan.model_cost import prefill_flops

logger = logging.getLogger(__name__)


def recompute_s(model: ModelSpec, hw: HardwareSpec, total_tokens: float, cached_tokens: float = 0.0) -> float:
    return prefill_flops(model, total_tokens, cached_tokens) / hw.prefill_flops_per_s


def segment_s(model: ModelSpec, hw: HardwareSpec, start: float, end: float, gbps: float) -> float:
    """Time to bring tokens [start, end) into the GPUs: load or recompute, whichever is faster."""
    recompute = (prefill_flops(model, end) - prefill_flops(model, start)) / hw.prefill_flops_per_s
    return min(load_s(model, end - start, gbps), recompute)


def ttft_s(model: ModelSpec, hw: HardwareSpec, prompt_tokens: float, tiers: list[TierSpec],
           shares: list[float]) -> float:
    """TTFT of a `prompt_tokens` request whose cached prefix is split over `tiers` by `shares`."""
    position = 0.0
    total = 0.0
    for tier, share in zip(tiers, shares, strict=True):
        end = min(prompt_tokens, position + share * prompt_tokens)
        total += segment_s(model, hw, position, end, tier.read_gbps)
        position = end
    return total + recompute_s(model, hw, prompt_tokens, position)


def ttft_pair_ms(model: ModelSpec, hw: HardwareSpec, prompt_lengths: Sequence[float], tiers: list[TierSpec],
                 shares: list[float]) -> tuple[float, float]:
    """Mean TTFT in ms over `prompt_lengths`, (without the store: GPU prefix cache only, with it);
    every request gets the trace-wide tier shares."""
    gpu_only = [shares[0]] + [0.0] * (len(shares) - 1)
    without = sum(ttft_s(model, hw, p, tiers, gpu_only) for p in prompt_lengths) / len(prompt_lengths)
    with_store = sum(ttft_s(model, hw, p, tiers, shares) for p in prompt_lengths) / len(prompt_lengths)
    return without * 1e3, with_store * 1e3
