"""Small factories for planner tests: a tiny model with hand-computable costs, tiny traces."""

from __future__ import annotations

import pytest

from kvstore.layout import KVLayout
from kvstore.plan.inputs import HardwareSpec, ModelSpec
from kvstore.sim.trace import Trace, TraceRequest


@pytest.fixture
def tiny_model() -> ModelSpec:
    # 2 planes x 1 layer x 1 kv head x 64 dims x 2 bytes = 256 B/token; 1e6 params; attention width
    # A = layers * heads * (qk + v) = 1 * 1 * 128 = 128 FLOPs per (T^2 - P^2).
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=64, dtype="bfloat16", chunk_tokens=16)
    return ModelSpec(name="tiny", layout=layout, num_params=1_000_000, num_active_params=1_000_000,
                     num_attention_heads=1, qk_head_dim=64, v_head_dim=64)


@pytest.fixture
def tiny_hw() -> HardwareSpec:
    # 1e9 FLOP/s of prefill; host link 1e-4 GB/s = 1e5 B/s, NVMe 5e4 B/s, PFS 1e6 B/s aggregate.
    return HardwareSpec(gpus=1, gpu_mem_bytes=10_000_000, gpu_tflops=0.001, mfu=1.0, gpu_cache_share=0.0,
                        host_bytes=1 << 20, host_gbps=1e-4, nvme_bytes=1 << 22, nvme_gbps=5e-5,
                        pfs_bytes=1 << 30, pfs_gbps=1e-3, nodes=1, nic_gbps=1e-4)


def make_trace(chains: list[tuple[int, ...]], block_tokens: int = 16) -> Trace:
    """One request per chain, 1 s apart, every block full."""
    return Trace("tiny", [TraceRequest(1000.0 * i, len(c) * block_tokens, c) for i, c in enumerate(chains)], block_tokens)
