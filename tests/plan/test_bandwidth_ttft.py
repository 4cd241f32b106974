"""Tier bandwidth, traffic, load-vs-recompute, TTFT and PFS scaling on a model sized by hand.

tiny_model: b = 256 B/token, N = 1e6 params, A = 128; tiny_hw: F = 1e9 FLOP/s, host link 1e5 B/s,
NVMe 5e4 B/s, PFS min(NIC 1e5, 1e6 / nodes) B/s, no GPU prefix cache.
"""

from __future__ import annotations

import pytest

from kvstore.plan.bandwidth import breakeven_tokens, node_tiers, tier_traffic
from kvstore.plan.inputs import HardwareSpec, ModelSpec
from kvstore.plan.pfs_scaling import node_counts, pfs_scaling
from kvstore.plan.ttft import recompute_s, ttft_pair_ms, ttft_s


def test_node_tiers(tiny_model: ModelSpec, tiny_hw: HardwareSpec) -> None:
    tiers = node_tiers(tiny_model, tiny_hw)
    assert [t.name for t in tiers] == ["gpu", "host", "nvme", "pfs"]
    assert [t.read_gbps for t in tiers[1:]] == [1e-4, 5e-5, 1e-4]
    assert tiers[0].capacity_bytes == 0  # gpu_cache_share 0


def test_breakeven_prefix_length(tiny_model: ModelSpec, tiny_hw: HardwareSpec) -> None:
    # T* = (b/bw - 2N/F) F / A: host (2.56e-3 - 2e-3) 1e9 / 128 = 4375; NVMe (5.12e-3 - 2e-3) 1e9 / 128 = 24375.
    assert breakeven_tokens(tiny_model, tiny_hw, 1e-4) == pytest.approx(4375)
    assert breakeven_tokens(tiny_model, tiny_hw, 5e-5) == pytest.approx(24375)
    assert breakeven_tokens(tiny_model, tiny_hw, 1.0) == 0.0  # 2.56e-7 s/token to load: always wins


def test_ttft_loads_only_where_loading_wins(tiny_model: ModelSpec, tiny_hw: HardwareSpec) -> None:
    tiers = node_tiers(tiny_model, tiny_hw)
    assert recompute_s(tiny_model, tiny_hw, 20_000) == pytest.approx(91.2)  # (4e10 + 128 * 4e8) / 1e9
    # Half of 20,000 tokens from host: load 10,000 * 256 / 1e5 = 25.6 s < recompute 32.8 s; rest 58.4 s.
    assert ttft_s(tiny_model, tiny_hw, 20_000, tiers, [0, 0.5, 0, 0]) == pytest.approx(84.0)
    # Half of 8,000 from host: load 10.24 s > recompute 10.048 s, so the engine recomputes: no gain.
    assert ttft_s(tiny_model, tiny_hw, 8_000, tiers, [0, 0.5, 0, 0]) == pytest.approx(recompute_s(tiny_model, tiny_hw, 8_000))
    without, with_store = ttft_pair_ms(tiny_model, tiny_hw, [20_000, 8_000], tiers, [0, 0.5, 0, 0])
    recompute_8k = recompute_s(tiny_model, tiny_hw, 8_000) * 1e3
    assert without == pytest.approx((91_200 + recompute_8k) / 2)
    assert with_store == pytest.approx((84_000 + recompute_8k) / 2)


def test_tier_traffic(tiny_model: ModelSpec, tiny_hw: HardwareSpec) -> None:
    # 2 req/s x 1000 tokens x 256 B = 5.12e-4 GB/s of prompt KV.
    rows = tier_traffic(tiny_model, node_tiers(tiny_model, tiny_hw), [0.1, 0.2, 0.3, 0.0], rps=2, prompt_tokens=1000)
    unit = 5.12e-4
    assert [r["read_gbps"] for r in rows] == pytest.approx([0.1 * unit, 0.2 * unit, 0.3 * unit, 0.0])
    # host gets what neither GPU nor host held (new KV + promotions); disks get the new KV (miss 40%).
    assert [r["write_gbps"] for r in rows] == pytest.approx([0.0, 0.7 * unit, 0.4 * unit, 0.4 * unit])
    assert rows[1]["utilization"] == pytest.approx(0.9 * unit / 1e-4)


def test_pfs_gain_per_node_vanishes_once_loading_is_slower_than_recomputing(tiny_model: ModelSpec, tiny_hw: HardwareSpec) -> None:
    tiers = node_tiers(tiny_model, tiny_hw)
    rows = pfs_scaling(tiny_model, tiny_hw, tiers, [0, 0, 0, 0.5], rps=2, prompt_lengths=[20_000])
    assert [r["nodes"] for r in rows] == node_counts(1) == [1, 2, 4, 8, 16, 32, 64]
    by_nodes = {r["nodes"]: r for r in rows}
    # Up to 8 nodes the NIC (1e5 B/s) caps each node: gain 91.2 - 84.0 s. At 16, 1e6/16 = 6.25e4 B/s:
    # loading 10,000 tokens takes 40.96 s > 32.8 s recomputing, so the PFS no longer helps.
    assert by_nodes[8]["gain_ms_per_node"] == pytest.approx(7_200)
    assert by_nodes[16]["pfs_gbps_per_node"] == pytest.approx(6.25e-5)
    assert by_nodes[16]["gain_ms_per_node"] == pytest.approx(0.0, abs=1e-6)
    assert by_nodes[4]["aggregate_demand_gbps"] == pytest.approx(4 * 2 * 20_000 * 0.5 * 256 / 1e9)


def test_host_link_counts_gpus_that_load_distinct_kv() -> None:
    from kvstore.plan.bandwidth import host_link_gbps
    from kvstore.plan.inputs import HardwareSpec
    from kvstore.plan.model_cost import model_from_preset

    hw = HardwareSpec(gpus=8, host_gbps=25.0)
    assert host_link_gbps(model_from_preset("llama-3-70b"), hw) == 200.0  # 8 kv heads over 8 GPUs
    assert host_link_gbps(model_from_preset("deepseek-v3"), hw) == 25.0  # one latent: every GPU loads it all
    assert host_link_gbps(model_from_preset("qwen2.5-7b"), hw) == 100.0  # 4 kv heads: 4 distinct shards
