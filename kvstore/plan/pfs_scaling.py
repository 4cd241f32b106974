"""How the per-node gain of a shared PFS tier shrinks as more nodes read it at once.

With n nodes each gets min(nic_gbps, pfs_gbps / n) (and no more than its host->GPU link). The PFS
serves the tokens no node-local tier holds (share h_pfs); its gain per node is the TTFT those
tokens save against recomputing them. Once loading at the node's share is slower than
recomputing, the engine recomputes and the gain is 0. The aggregate PFS read demand
n * rps * P * h_pfs * bytes_per_token is shown beside the PFS bandwidth. Cross-node hits (one
node reading another's chunks) are not in a single-node trace, so the PFS share is the same at
every n: the figure is a lower bound on the hit rate and an upper bound on the gain per node.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from kvstore.plan.bandwidth import TierSpec, host_link_gbps
from kvstore.plan.inputs import HardwareSpec, ModelSpec
from kvstore.plan.model_cost import bytes_per_token
from kvstore.plan.ttft import ttft_s

logger = logging.getLogger(__name__)


def node_counts(nodes: int) -> list[int]:
    counts = [1]
    while counts[-1] < max(64, 2 * nodes):
        counts.append(counts[-1] * 2)
    return sorted(set(counts) | {nodes})


def pfs_scaling(model: ModelSpec, hw: HardwareSpec, tiers: list[TierSpec], shares: list[float], rps: float,
                prompt_lengths: Sequence[float]) -> list[dict[str, float]]:
    """Per node count: PFS GB/s per node, mean TTFT gain the PFS tier gives one node, aggregate demand."""
    no_pfs = shares[:-1] + [0.0]
    prompt_tokens = sum(prompt_lengths) / len(prompt_lengths)
    rows = []
    for n in node_counts(hw.nodes):
        node_hw = dataclasses.replace(hw, nodes=n)
        link = host_link_gbps(model, hw)
        pfs = dataclasses.replace(tiers[-1], read_gbps=min(node_hw.pfs_node_gbps, link))
        at_n = tiers[:-1] + [pfs]
        gain = sum(ttft_s(model, node_hw, p, at_n, no_pfs) - ttft_s(model, node_hw, p, at_n, shares)
                   for p in prompt_lengths) / len(prompt_lengths)
        demand = n * rps * prompt_tokens * shares[-1] * bytes_per_token(model) / 1e9
        rows.append({"nodes": n, "pfs_gbps_per_node": pfs.read_gbps, "gain_ms_per_node": gain * 1e3,
                     "aggregate_demand_gbps": demand, "pfs_gbps": hw.pfs_gbps})
    return rows
