"""The planner's recommendation per tier (fill the fastest first, inclusive) and its JSON fields."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvstore.errors import ConfigError
from kvstore.plan.inputs import HardwareSpec, ModelSpec, Target
from kvstore.plan.planner import PlanInputs, Planner
from kvstore.store.memory_model import INDEX_ENTRY_BYTES, KEY_BYTES, LEDGER_ENTRY_BYTES, planned_bytes, tier_chunk_bytes

from .test_capacity import CHAINS, make_trace


def _planner(tiny_model: ModelSpec, hw: Any, target: Target | None) -> Planner:
    return Planner(PlanInputs(model=tiny_model, hardware=hw, trace=make_trace(CHAINS), workload_note="test",
                              target=target, policy="lru"))


def test_hit_rate_target_fills_host_then_nvme_then_pfs(tiny_model: ModelSpec, tiny_hw: HardwareSpec) -> None:
    # 16-token blocks of 256 B/token = 4096 B. Host holds 1 block, NVMe 2; a 50% target needs 3.
    hw = dataclasses.replace(tiny_hw, host_bytes=4096, nvme_bytes=8192)
    plan = _planner(tiny_model, hw, Target(hit_rate=0.5)).run()
    assert plan["bytes_per_token"] == 256
    assert plan["need_bytes"] == 3 * 4096
    assert [t["recommended_capacity_bytes"] for t in plan["tiers"]] == [0, 4096, 8192, 3 * 4096]
    assert plan["hit_rate"] == pytest.approx(4 / 7)
    assert all(t["fits"] for t in plan["tiers"])


def test_unreachable_target_is_reported(tiny_model: ModelSpec, tiny_hw: HardwareSpec) -> None:
    plan = _planner(tiny_model, tiny_hw, Target(hit_rate=0.9)).run()
    assert plan["target_met"] is False and plan["need_bytes"] is None


def test_default_target_is_95_percent_of_the_ceiling(tiny_model: ModelSpec, tiny_hw: HardwareSpec) -> None:
    plan = _planner(tiny_model, tiny_hw, None).run()
    assert plan["target"]["hit_rate"] == round(0.95 * 4 / 7, 4)


def test_ttft_target_takes_the_smallest_capacity_that_meets_it(tiny_model: ModelSpec, tiny_hw: HardwareSpec) -> None:
    hw = dataclasses.replace(tiny_hw, host_gbps=1.0, host_bytes=1 << 20)  # loading from host always wins
    planner = _planner(tiny_model, hw, None)
    goal = planner.evaluate(planner.blocks_for(3))[2]
    assert planner.evaluate(planner.blocks_for(2))[2] > goal
    assert planner.need_blocks(Target(ttft_ms=goal)) == 3


def test_target_needs_exactly_one_goal() -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        Target(hit_rate=0.5, ttft_ms=100)


def test_ttft_target_met_without_the_store_needs_nothing(tiny_model: ModelSpec, tiny_hw: HardwareSpec) -> None:
    planner = _planner(tiny_model, tiny_hw, None)
    assert planner.need_blocks(Target(ttft_ms=1e9)) == 0
    plan = _planner(tiny_model, tiny_hw, Target(ttft_ms=1e9)).run()
    assert [t["recommended_capacity_bytes"] for t in plan["tiers"]] == [0, 0, 0, 0]


def test_host_memory_counts_the_daemons_state_for_every_chunk_it_holds(tiny_model: ModelSpec,
                                                                       tiny_hw: HardwareSpec) -> None:
    # Host 1 block, NVMe 2, PFS 3 (as above): the daemon indexes 3 chunks, holds 1 in memory and 2 + 3 on disk.
    hw = dataclasses.replace(tiny_hw, host_bytes=4096, nvme_bytes=8192)
    memory = _planner(tiny_model, hw, Target(hit_rate=0.5)).run()["host_memory"]
    expected = (3 * (KEY_BYTES + INDEX_ENTRY_BYTES + LEDGER_ENTRY_BYTES) + tier_chunk_bytes(is_memory=True, eviction="lru")
                + 5 * tier_chunk_bytes(is_memory=False, eviction="lru"))
    assert memory["daemon_chunk_state_bytes"] == expected
    assert memory["host_tier_bytes"] == 4096 and memory["total_bytes"] == 4096 + expected
    assert memory["daemon_bytes_per_disk_chunk"] == planned_bytes([(False, "lru", 1)]) + LEDGER_ENTRY_BYTES
    assert memory["fits"] is False  # the host tier fills the 4 KiB given; the daemon's state does not fit beside it
    roomy = _planner(tiny_model, dataclasses.replace(hw, host_bytes=1 << 20), Target(hit_rate=0.5)).run()
    assert roomy["host_memory"]["fits"] is True
