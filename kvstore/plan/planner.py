"""Put the parts together: from model, workload, hardware and target to one plan (a JSON-able dict).

Recommended capacities fill the fastest tier first under the inclusive hierarchy of capacity.py:
the GPU prefix cache is what the hardware leaves; host holds min(need, host size) when the GPU
cache falls short; NVMe holds
min(need, NVMe size) when host alone falls short; the PFS holds the need when NVMe falls short (even beyond its given size,
flagged as not fitting).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from kvstore.plan.bandwidth import breakeven_tokens, load_s, node_tiers, tier_traffic
from kvstore.plan.capacity import HitRateModel
from kvstore.plan.inputs import HardwareSpec, ModelSpec, Target
from kvstore.plan.model_cost import bytes_per_token
from kvstore.plan.pfs_scaling import pfs_scaling
from kvstore.plan.plan_record import CurveRow, HostMemorySection, ModelSection, Plan, TierRow, WorkloadSection
from kvstore.plan.ttft import recompute_s, ttft_pair_ms
from kvstore.plan.workload import trace_stats, working_set
from kvstore.sim.trace import Trace
from kvstore.store.memory_model import LEDGER_ENTRY_BYTES, planned_bytes

logger = logging.getLogger(__name__)

MAX_TTFT_SAMPLES = 1000  # prompt lengths TTFT is averaged over


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanInputs:
    model: ModelSpec
    hardware: HardwareSpec
    trace: Trace
    workload_note: str
    target: Target | None = None  # None: 95% of the hit rate unlimited capacity reaches
    policy: str = "lru"
    rps: float | None = None  # None: the trace's own rate


class Planner:
    """Evaluates tier configurations for one model, workload and node; `run()` builds the plan."""

    def __init__(self, inputs: PlanInputs) -> None:
        self.inputs = inputs
        self.model = inputs.model
        self.hw = inputs.hardware
        self.stats = trace_stats(inputs.trace)
        self.rps = inputs.rps or self.stats.rps
        self.prompt_tokens = self.stats.mean_prompt_tokens
        requests = inputs.trace.requests
        step = max(1, len(requests) // MAX_TTFT_SAMPLES)
        self.prompt_lengths = [float(r.input_tokens) for r in requests[::step]]
        self.block_bytes = bytes_per_token(self.model) * inputs.trace.block_tokens
        self.tiers = node_tiers(self.model, self.hw)
        self.hits = HitRateModel(inputs.trace, inputs.policy, self.block_bytes)
        self.hw_blocks = [t.capacity_bytes // self.block_bytes for t in self.tiers]

    def blocks_for(self, need_blocks: int) -> list[int]:
        """Per-tier blocks (fastest first) reaching `need_blocks`: host and NVMe up to their size,
        the PFS takes whatever is still missing (it may exceed the PFS given: see `fits`)."""
        gpu, host_hw, nvme_hw, _ = self.hw_blocks
        host = min(need_blocks, host_hw) if need_blocks > gpu else 0
        nvme = min(need_blocks, nvme_hw) if need_blocks > max(gpu, host) else 0
        pfs = need_blocks if need_blocks > max(gpu, host, nvme) else 0
        return [gpu, host, nvme, pfs]

    def evaluate(self, tier_blocks: list[int]) -> tuple[list[float], float, float]:
        """(token share per tier, TTFT without the store ms, TTFT with it ms)."""
        shares = self.hits.tier_shares(tier_blocks)
        tiers = [dataclasses.replace(t, capacity_bytes=b * self.block_bytes) for t, b in zip(self.tiers, tier_blocks, strict=True)]
        without, with_store = ttft_pair_ms(self.model, self.hw, self.prompt_lengths, tiers, shares)
        return shares, without, with_store

    def need_blocks(self, target: Target) -> int | None:
        """Blocks of reach that meet the target; None when no capacity does."""
        if target.hit_rate is not None:
            return self.hits.blocks_for_hit_rate(target.hit_rate)
        assert target.ttft_ms is not None
        low, high = 0, self.hits.num_distinct_blocks
        if self.evaluate(self.blocks_for(high))[2] > target.ttft_ms:
            return None
        if self.evaluate(self.blocks_for(0))[2] <= target.ttft_ms:
            return 0  # met without the store
        for _ in range(10):
            if high - low <= 1:
                break
            mid = (low + high) // 2
            if self.evaluate(self.blocks_for(mid))[2] <= target.ttft_ms:
                high = mid
            else:
                low = mid
        return high

    def target(self) -> Target:
        if self.inputs.target is not None:
            return self.inputs.target
        ceiling = self.hits.hit_rate(self.hits.num_distinct_blocks)
        return Target(hit_rate=max(1e-6, round(0.95 * ceiling, 4)))

    def run(self) -> Plan:
        target = self.target()
        need = self.need_blocks(target)
        rec_blocks = self.blocks_for(need if need is not None else self.hits.num_distinct_blocks)
        shares, without_ms, with_ms = self.evaluate(rec_blocks)
        hw_shares, _, hw_with_ms = self.evaluate(self.hw_blocks)
        reach = [max(rec_blocks[: i + 1]) for i in range(len(rec_blocks))] + [max(self.hw_blocks)]
        curve = self.hits.curve(extra_blocks=tuple(reach))
        return {
            "model": self._model_section(),
            "bytes_per_token": bytes_per_token(self.model),
            "bytes_per_request": bytes_per_token(self.model) * self.prompt_tokens,
            "workload": self._workload_section(),
            "working_set": working_set(self.inputs.trace, self.block_bytes),
            "hardware": dataclasses.asdict(self.hw),
            "policy": self.inputs.policy,
            "target": {"hit_rate": target.hit_rate, "ttft_ms": target.ttft_ms},
            "target_met": need is not None,
            "need_bytes": None if need is None else need * self.block_bytes,
            "tiers": self._tier_rows(rec_blocks, shares),
            "host_memory": self._host_memory(rec_blocks),
            "hit_rate": sum(shares), "hardware_hit_rate": sum(hw_shares),
            "ttft_ms": {"recompute_all": self._recompute_all_ms(),
                        "without_store": without_ms, "with_store": with_ms, "with_store_full_hardware": hw_with_ms},
            "hit_rate_curve": [CurveRow(capacity_blocks=p.capacity_blocks, capacity_bytes=p.capacity_bytes,
                                        hit_rate=p.hit_rate, min_hit_rate=p.min_hit_rate, block_hit_rate=p.block_hit_rate,
                                        ttft_ms=self.evaluate(self.blocks_for(p.capacity_blocks))[2])
                               for p in curve],
            "pfs_scaling": pfs_scaling(self.model, self.hw, self.tiers, hw_shares, self.rps, self.prompt_lengths),
        }

    def _host_memory(self, rec_blocks: list[int]) -> HostMemorySection:
        """Host memory the plan takes: the host tier and the daemon's per-chunk state (index, tier records,
        policy state, ledger) for every chunk the daemon holds (host, NVMe, PFS; the GPU prefix cache is the
        engine's), as kvstore/store/memory_model.py counts it."""
        _, host, nvme, pfs = rec_blocks
        held = [(True, self.inputs.policy, host), (False, self.inputs.policy, nvme), (False, self.inputs.policy, pfs)]
        daemon = planned_bytes(held) + max(host, nvme, pfs) * LEDGER_ENTRY_BYTES
        host_tier = host * self.block_bytes
        return {"host_tier_bytes": host_tier, "daemon_chunk_state_bytes": daemon,
                "daemon_bytes_per_disk_chunk": planned_bytes([(False, self.inputs.policy, 1)]) + LEDGER_ENTRY_BYTES,
                "total_bytes": host_tier + daemon, "fits": host_tier + daemon <= self.hw.host_bytes}

    def _recompute_all_ms(self) -> float:
        total = sum(recompute_s(self.model, self.hw, p) for p in self.prompt_lengths)
        return total / len(self.prompt_lengths) * 1e3

    def _workload_section(self) -> WorkloadSection:
        s = self.stats
        return {"num_requests": s.num_requests, "duration_s": s.duration_s, "rps": s.rps,
                "mean_prompt_tokens": s.mean_prompt_tokens, "num_accesses": s.num_accesses,
                "num_distinct_blocks": s.num_distinct_blocks, "block_tokens": s.block_tokens, "rps_used": self.rps,
                "source": self.inputs.trace.name, "block_ids": self.inputs.workload_note, "block_bytes": self.block_bytes}

    def _model_section(self) -> ModelSection:
        m = self.model
        return {"name": m.name, "layout": m.layout.to_dict(), "codec": m.codec, "num_params": m.num_params,
                "num_active_params": m.num_active_params, "weight_bytes": m.weight_bytes}

    def _tier_rows(self, rec_blocks: list[int], shares: list[float]) -> list[TierRow]:
        planned = [dataclasses.replace(t, capacity_bytes=b * self.block_bytes) for t, b in zip(self.tiers, rec_blocks, strict=True)]
        traffic = tier_traffic(self.model, planned, shares, self.rps, self.prompt_tokens)
        rows: list[TierRow] = []
        for tier, blocks, share, flow in zip(self.tiers, rec_blocks, shares, traffic, strict=True):
            rows.append({"name": tier.name, "hardware_capacity_bytes": tier.capacity_bytes,
                         "recommended_capacity_bytes": blocks * self.block_bytes,
                         "fits": blocks * self.block_bytes <= tier.capacity_bytes,
                         "token_share": share, "tier_gbps": tier.read_gbps, "read_gbps": flow["read_gbps"],
                         "write_gbps": flow["write_gbps"], "utilization": flow["utilization"],
                         "breakeven_tokens": breakeven_tokens(self.model, self.hw, tier.read_gbps),
                         "load_ms_mean_prompt": load_s(self.model, self.prompt_tokens, tier.read_gbps) * 1e3})
        return rows

