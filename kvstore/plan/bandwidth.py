"""Per-tier capacity and bandwidth of a node, the traffic each tier must carry, and when loading wins.

    read GB/s of tier k  = rps * prompt_tokens * share_k * bytes_per_token / 1e9
    write GB/s, host     = rps * prompt_tokens * (1 - share_gpu - share_host) * bytes_per_token / 1e9
                           (new KV, and disk hits promoted into host)
    write GB/s, disk     = rps * prompt_tokens * miss * bytes_per_token / 1e9   (new KV copied down)

Loading a T-token prefix from a tier takes T * b / bw; recomputing it takes
(2 N T + A T^2) / F (model_cost.prefill_flops). Loading wins for every T above

    T* = max(0, (b / bw - 2 N / F) * F / A)

so a tier with b / bw <= 2 N / F beats recomputing at any length.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from kvstore.plan.inputs import HardwareSpec, ModelSpec
from kvstore.plan.model_cost import bytes_per_token

logger = logging.getLogger(__name__)

TIER_NAMES = ("gpu", "host", "nvme", "pfs")


@dataclass(frozen=True, slots=True, kw_only=True)
class TierSpec:
    """One tier as the planner sees it: bytes it may hold and GB/s it delivers into the GPUs."""

    name: str
    capacity_bytes: int
    read_gbps: float  # math.inf for the GPU prefix cache (already in place)


def node_tiers(model: ModelSpec, hw: HardwareSpec) -> list[TierSpec]:
    """The four tiers of a node, fastest first. Tensor parallelism shards KV by kv head, so
    min(gpus, kv_heads) GPUs load distinct bytes at once (an MLA latent is one head: every GPU
    needs all of it, and the link is one GPU's); disk reads also pass that link."""
    hbm_free = max(0, hw.gpus * hw.gpu_mem_bytes * 0.9 - model.weight_bytes)
    link = host_link_gbps(model, hw)
    return [
        TierSpec(name="gpu", capacity_bytes=int(hbm_free * hw.gpu_cache_share), read_gbps=math.inf),
        TierSpec(name="host", capacity_bytes=hw.host_bytes, read_gbps=link),
        TierSpec(name="nvme", capacity_bytes=hw.nvme_bytes, read_gbps=min(hw.nvme_gbps, link)),
        TierSpec(name="pfs", capacity_bytes=hw.pfs_bytes, read_gbps=min(hw.pfs_node_gbps, link)),
    ]


def host_link_gbps(model: ModelSpec, hw: HardwareSpec) -> float:
    """GB/s of distinct KV the host can push into the GPUs of one replica."""
    return min(hw.gpus, model.layout.num_kv_heads) * hw.host_gbps


def load_s(model: ModelSpec, tokens: float, gbps: float) -> float:
    return 0.0 if math.isinf(gbps) else tokens * bytes_per_token(model) / (gbps * 1e9)


def breakeven_tokens(model: ModelSpec, hw: HardwareSpec, gbps: float) -> float:
    """Prefix length above which loading from a tier at `gbps` beats recomputing (0: always)."""
    if math.isinf(gbps):
        return 0.0
    flops_s = hw.prefill_flops_per_s
    per_token_load = bytes_per_token(model) / (gbps * 1e9)
    per_token_linear = 2.0 * model.num_active_params / flops_s
    attn = model.layout.num_layers * model.num_attention_heads * (model.qk_head_dim + model.v_head_dim)
    return max(0.0, (per_token_load - per_token_linear) * flops_s / attn)


def tier_traffic(model: ModelSpec, tiers: list[TierSpec], shares: list[float], rps: float,
                 prompt_tokens: float) -> list[dict[str, float]]:
    """Read and write GB/s each tier carries at `rps`, and its utilization of the tier's bandwidth."""
    token_bytes_s = rps * prompt_tokens * bytes_per_token(model) / 1e9
    miss = max(0.0, 1.0 - sum(shares))
    above_host = sum(shares[:2])
    rows = []
    for tier, share in zip(tiers, shares, strict=True):
        read = token_bytes_s * share
        if tier.name == "gpu":
            write = 0.0
        elif tier.name == "host":
            write = token_bytes_s * (1.0 - above_host)
        else:
            write = token_bytes_s * miss if tier.capacity_bytes else 0.0
        util = 0.0 if math.isinf(tier.read_gbps) else (read + write) / tier.read_gbps
        rows.append({"read_gbps": read, "write_gbps": write, "utilization": util})
    return rows
