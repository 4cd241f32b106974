"""Hit rate against capacity, from trace replay under the chosen eviction policy, MIN as the bound.

Every figure comes from `kvstore.sim.replay.replay` (the one simulator); this module only picks the
capacities, caches results and searches. The hit rate is the token hit rate: the share of prompt
tokens inside each request's leading run of cached blocks (what saves prefill).

Tiers form an inclusive hierarchy (the store copies every chunk to each disk tier), so tier k with
capacity C_k catches what a cache of max(C_0..C_k) catches and serves

    share_k = H(max(C_0..C_k)) - H(max(C_0..C_k-1))      H = replay hit rate at a capacity.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kvstore.sim.replay import ReplayResult, replay
from kvstore.sim.trace import Trace

logger = logging.getLogger(__name__)

CURVE_PCTS = (0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class CurvePoint:
    """Hit rates at one capacity: the chosen policy's and Belady's MIN (the optimum)."""

    capacity_blocks: int
    capacity_bytes: int
    hit_rate: float
    min_hit_rate: float
    block_hit_rate: float


class HitRateModel:
    """Replays `trace` under `policy` on demand; each (policy, capacity) is replayed once."""

    def __init__(self, trace: Trace, policy: str, block_bytes: int) -> None:
        self.trace = trace
        self.policy = policy
        self.block_bytes = block_bytes
        self.num_distinct_blocks = trace.num_distinct_blocks
        self._results: dict[tuple[str, int], ReplayResult] = {}

    def result(self, capacity_blocks: int, policy: str | None = None) -> ReplayResult:
        """Replay at `capacity_blocks` (clamped to [1, distinct blocks]: more never helps)."""
        policy = policy or self.policy
        blocks = max(1, min(int(capacity_blocks), self.num_distinct_blocks))
        key = (policy, blocks)
        if key not in self._results:
            pct = blocks * 100.0 / self.num_distinct_blocks
            self._results[key] = replay(self.trace, policy, pct)
            logger.info("replayed %s at %d blocks: token hit rate %.4f", policy, blocks, self._results[key].token_hit_rate)
        return self._results[key]

    def hit_rate(self, capacity_blocks: int, policy: str | None = None) -> float:
        if capacity_blocks <= 0:
            return 0.0
        return self.result(capacity_blocks, policy).token_hit_rate

    def curve(self, pcts: tuple[float, ...] = CURVE_PCTS, extra_blocks: tuple[int, ...] = ()) -> list[CurvePoint]:
        """Hit rate (policy and MIN) at each share of the distinct blocks, plus `extra_blocks`."""
        grid = {max(1, round(self.num_distinct_blocks * p / 100)) for p in pcts}
        grid |= {min(b, self.num_distinct_blocks) for b in extra_blocks if b > 0}
        points = []
        for blocks in sorted(grid):
            result = self.result(blocks)
            points.append(CurvePoint(capacity_blocks=blocks, capacity_bytes=blocks * self.block_bytes,
                                     hit_rate=result.token_hit_rate, min_hit_rate=self.hit_rate(blocks, "min"),
                                     block_hit_rate=result.block_hit_rate))
        return points

    def blocks_for_hit_rate(self, target: float, *, steps: int = 8) -> int | None:
        """Fewest blocks (within 1/2**steps of the bracket) whose hit rate reaches `target`;
        None when even unlimited capacity falls short (the trace's reuse caps the hit rate)."""
        high = self.num_distinct_blocks
        if self.hit_rate(high) < target:
            return None
        low = 0
        for _ in range(steps):
            if high - low <= 1:
                break
            mid = (low + high) // 2
            if self.hit_rate(mid) >= target:
                high = mid
            else:
                low = mid
        return high

    def tier_shares(self, tier_blocks: list[int]) -> list[float]:
        """Token share served by each tier (fastest first) of an inclusive hierarchy."""
        shares = []
        reach = 0
        previous = 0.0
        for blocks in tier_blocks:
            reach = max(reach, blocks)
            cumulative = self.hit_rate(reach)
            shares.append(max(0.0, cumulative - previous))
            previous = max(previous, cumulative)
        return shares
