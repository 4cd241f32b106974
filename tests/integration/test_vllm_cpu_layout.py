"""connector/vllm/paged.py's reading of vLLM's CPU cache layout, checked against vLLM's own cache-write kernel:
`cpu_attn_reshape_and_cache` puts each token's K and V where gather_layer must find them."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")

import torch
from vllm import _custom_ops as ops
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

from connector.vllm.paged import PagedKind, gather_layer, scatter_layer

pytestmark = pytest.mark.integration
BLOCKS, HEADS, BLOCK, DIM = 6, 2, 32, 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_finds_what_vllms_cpu_kernel_wrote(dtype: torch.dtype) -> None:
    isa = _get_attn_isa(dtype, BLOCK, DIM, "auto")
    cache = torch.zeros(BLOCKS, HEADS, BLOCK, 2 * DIM, dtype=dtype)
    key_cache, value_cache = cache.view(BLOCKS, HEADS, 2 * BLOCK, DIM).chunk(2, dim=2)  # as cpu_attn.forward does
    block_ids = [4, 1]
    tokens = len(block_ids) * BLOCK
    gen = torch.Generator().manual_seed(3)
    key = torch.randn(tokens, HEADS, DIM, generator=gen).to(dtype)
    value = torch.randn(tokens, HEADS, DIM, generator=gen).to(dtype)
    slots = torch.tensor([block_ids[t // BLOCK] * BLOCK + t % BLOCK for t in range(tokens)], dtype=torch.long)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)
    chunk = torch.empty(2, tokens, HEADS, DIM, dtype=dtype)
    gather_layer(cache, PagedKind.HEAD_PLANES, block_ids, chunk)
    assert torch.equal(chunk[0], key), f"K as kvstore reads it (isa {isa})"
    assert torch.equal(chunk[1], value), f"V as kvstore reads it (isa {isa})"
    again = torch.zeros_like(cache)
    scatter_layer(chunk, PagedKind.HEAD_PLANES, block_ids, again)
    assert torch.equal(again[block_ids], cache[block_ids])
