"""The planner's inputs as frozen dataclasses: model, hardware, parametric workload and target."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kvstore.errors import ConfigError
from kvstore.layout import KVLayout

logger = logging.getLogger(__name__)

GB = 1e9
GIB = 1 << 30


def _require_positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ConfigError(f"{owner}.{name} must be > 0, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A model as the planner sees it: its KV geometry and what prefill costs.

    Attributes:
        layout: KV geometry in the dtype the engine computes KV in.
        num_params: all weights (sets GPU memory left for KV).
        num_active_params: weights touched per token (MoE: fewer than num_params).
        num_attention_heads: query heads (attention FLOPs).
        qk_head_dim / v_head_dim: per-head widths of Q.K and of V (equal for Llama; 192/128 for
            DeepSeek-V3's MLA).
        weight_bytes_per_param: 2 for bf16 weights, 1 for fp8.
        codec: how the store keeps KV: `none`, `fp8` or `int8` (per-token, with scales).
    """

    name: str
    layout: KVLayout
    num_params: int
    num_active_params: int
    num_attention_heads: int
    qk_head_dim: int
    v_head_dim: int
    weight_bytes_per_param: int = 2
    codec: str = "none"

    def __post_init__(self) -> None:
        _require_positive("ModelSpec", num_params=self.num_params, num_active_params=self.num_active_params,
                          num_attention_heads=self.num_attention_heads, qk_head_dim=self.qk_head_dim,
                          v_head_dim=self.v_head_dim, weight_bytes_per_param=self.weight_bytes_per_param)
        if self.num_active_params > self.num_params:
            raise ConfigError(f"ModelSpec.num_active_params ({self.num_active_params:,}) exceeds num_params "
                              f"({self.num_params:,}); pass the active count of an MoE model")

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.weight_bytes_per_param


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareSpec:
    """One serving node (or `nodes` identical ones sharing a PFS). Bandwidths in GB/s (1e9 B/s).

    Attributes:
        gpus: GPUs serving one model replica (tensor parallel); their FLOP/s add up.
        gpu_mem_bytes: memory of one GPU.
        gpu_tflops: dense bf16 TFLOP/s of one GPU (peak); `mfu` is the share prefill reaches.
        gpu_cache_share: share of HBM left after weights that holds cached prefixes (the rest
            holds running requests).
        host_bytes / nvme_bytes / pfs_bytes: capacity the store may use on each tier.
        host_gbps: host->GPU copy bandwidth of one GPU (PCIe); all GPUs load their shard at once.
        nvme_gbps: read bandwidth of the node's NVMe; pfs_gbps: aggregate PFS bandwidth shared by
            all `nodes`; nic_gbps: the node's network link (caps its PFS share).
    """

    gpus: int = 8
    gpu_mem_bytes: int = 80 * GIB
    gpu_tflops: float = 989.0
    mfu: float = 0.5
    gpu_cache_share: float = 0.5
    host_bytes: int = 1024 * GIB
    host_gbps: float = 25.0
    nvme_bytes: int = 8 * 1024 * GIB
    nvme_gbps: float = 12.0
    pfs_bytes: int = 1024 * 1024 * GIB
    pfs_gbps: float = 100.0
    nodes: int = 1
    nic_gbps: float = 50.0

    def __post_init__(self) -> None:
        _require_positive("HardwareSpec", gpus=self.gpus, gpu_mem_bytes=self.gpu_mem_bytes, gpu_tflops=self.gpu_tflops,
                          mfu=self.mfu, host_gbps=self.host_gbps, nvme_gbps=self.nvme_gbps, pfs_gbps=self.pfs_gbps,
                          nodes=self.nodes, nic_gbps=self.nic_gbps)
        for name in ("host_bytes", "nvme_bytes", "pfs_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"HardwareSpec.{name} must be >= 0 (0 = no such tier), got {getattr(self, name)}")
        if not (0 < self.mfu <= 1 and 0 <= self.gpu_cache_share <= 1):
            raise ConfigError(f"mfu must be in (0, 1] and gpu_cache_share in [0, 1], got {self.mfu}, {self.gpu_cache_share}")

    @property
    def prefill_flops_per_s(self) -> float:
        return self.gpus * self.gpu_tflops * 1e12 * self.mfu

    @property
    def pfs_node_gbps(self) -> float:
        """PFS bandwidth one node gets when all `nodes` read at once."""
        return min(self.nic_gbps, self.pfs_gbps / self.nodes)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadParams:
    """A synthetic conversation workload (see `workload.parametric_trace` for the exact model)."""

    rps: float = 1.0
    prompt_tokens: int = 2048
    output_tokens: int = 256
    repeat_share: float = 0.5
    sessions: int = 100
    turns: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        _require_positive("WorkloadParams", rps=self.rps, prompt_tokens=self.prompt_tokens, sessions=self.sessions,
                          turns=self.turns)
        if self.output_tokens < 0 or not 0 <= self.repeat_share <= 1:
            raise ConfigError(f"output_tokens must be >= 0 and repeat_share in [0, 1], got "
                              f"{self.output_tokens}, {self.repeat_share}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """What the plan must reach: a token hit rate, or a mean TTFT (exactly one)."""

    hit_rate: float | None = None
    ttft_ms: float | None = None

    def __post_init__(self) -> None:
        if (self.hit_rate is None) == (self.ttft_ms is None):
            raise ConfigError("give exactly one target: --target-hit-rate or --target-ttft-ms")
        if self.hit_rate is not None and not 0 < self.hit_rate <= 1:
            raise ConfigError(f"--target-hit-rate is a share in (0, 1], got {self.hit_rate}")
        if self.ttft_ms is not None and self.ttft_ms <= 0:
            raise ConfigError(f"--target-ttft-ms must be > 0, got {self.ttft_ms}")
