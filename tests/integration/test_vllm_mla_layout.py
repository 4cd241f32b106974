"""connector/vllm/paged.py's reading of vLLM's MLA caches, checked against vLLM's own MLA cache writes on CPU: CPU_MLA's
`do_kv_cache_update` and AMX_MLA's `concat_and_cache_mla_cpu` kernel put each token's [kv_c | k_pe] latent where
gather_layer must find it, in the 4-d [blocks, 1, block_size, latent] cache vLLM 0.32 hands the connector."""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")

import torch
from vllm import _custom_ops as ops
from vllm.v1.attention.backends.mla.cpu_mla import CPUMLAImpl

from connector.vllm.paged import PagedKind, detect_latent, gather_layer, scatter_layer

pytestmark = pytest.mark.integration
BLOCKS, KV_LORA_RANK, ROPE_DIM = 8, 512, 64
LATENT = KV_LORA_RANK + ROPE_DIM


def _tokens(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(6)
    return (torch.randn(n, KV_LORA_RANK, generator=gen).bfloat16(),
            torch.randn(n, 1, ROPE_DIM, generator=gen).bfloat16())


def _cpu_mla_write(cache: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor, slots: torch.Tensor) -> None:
    CPUMLAImpl.do_kv_cache_update(None, kv_c, k_pe, cache, slots, "auto", torch.tensor(1.0))  # type: ignore[arg-type]


def _amx_mla_write(cache: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor, slots: torch.Tensor) -> None:
    ops.amx_mla_concat_and_cache(kv_c, k_pe.squeeze(1), cache[:, 0], slots)  # the kernel's 3-d view of the cache


@pytest.mark.parametrize(("write", "block"), [(_cpu_mla_write, 16), (_amx_mla_write, 32)], ids=["cpu_mla", "amx_mla"])
def test_gather_finds_the_latents_vllms_mla_cache_write_put(write: Callable[..., None], block: int) -> None:
    block_ids = [5, 2, 7]
    kv_c, k_pe = _tokens(len(block_ids) * block)
    slots = torch.tensor([block_ids[t // block] * block + t % block for t in range(len(kv_c))], dtype=torch.long)
    cache = torch.zeros(BLOCKS, 1, block, LATENT, dtype=torch.bfloat16)
    write(cache, kv_c, k_pe, slots)
    assert detect_latent(cache, block_size=block, latent_dim=LATENT) is PagedKind.LATENT
    chunk = torch.empty(1, len(kv_c), 1, LATENT, dtype=torch.bfloat16)
    gather_layer(cache, PagedKind.LATENT, block_ids, chunk)
    expected = torch.cat([kv_c, k_pe.squeeze(1)], dim=-1)
    assert torch.equal(chunk[0, :, 0].view(torch.int16), expected.view(torch.int16))
    moved = torch.zeros_like(cache)  # the chunk is canonical: into other blocks it is what vLLM writes there
    write(moved, kv_c, k_pe, torch.tensor([[0, 1, 3][t // block] * block + t % block for t in range(len(kv_c))]))
    target = torch.zeros_like(cache)
    scatter_layer(chunk, PagedKind.LATENT, [0, 1, 3], target)
    assert torch.equal(target.view(torch.int16), moved.view(torch.int16))
