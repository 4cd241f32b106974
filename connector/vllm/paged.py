"""Copies between vLLM's per-layer paged KV tensors and kvstore's chunks (pure torch, no vllm import).

vLLM hands a KV connector one tensor per attention layer. vLLM 0.32 gives every backend the logical
per-layer shape [num_blocks, kv_heads, block_size, 2 * head_dim], but what the last two dims hold
depends on the backend (and older releases used a K/V-first shape on CUDA)::

    HEAD_PLANES   CPU backend (cpu_attn), its "vec" and "vec16" ISAs: each (block, head) holds the
                  block's K transposed, [head_dim, block_size], then its V, [block_size, head_dim]
    AMX_PLANES    CPU backend, "amx" ISA (bf16 on CPUs with AMX tiles, block_size a multiple of 32): K
                  packed for the tile multiply, [block_size/16, head_dim/2, 16 tokens, 2 dims], then V
                  packed in token pairs, [head_dim/16, block_size/2, 16 dims, 2 tokens]
                  (both CPU layouts are checked against what vLLM's cpu_attn_reshape_and_cache writes,
                  for every ISA the machine has: tests/integration/test_vllm_cpu_layout.py; an ISA whose
                  layout is not known here (neon, vsx, ...) is read as HEAD_PLANES, which round-trips
                  exactly, and the connector keeps those chunks to vLLM on that ISA: `cpu_isa_scope`)
    TOKEN_CONCAT  flash-attn family: token t of (block, head) is [K(dim) | V(dim)] (split at head_dim);
                  any strides (the physical order may be [blocks, block_size, heads, 2*dim])
    KV_FIRST      [2, num_blocks, block_size, kv_heads, head_dim]: K plane, V plane (vLLM < 0.30 CUDA)
    LATENT        MLA (DeepSeek-V2/V3, Kimi...): one latent per token, [kv_lora_rank | rope], no heads, no V.
                  vLLM 0.32 views every MLA backend's cache as [num_blocks, 1, block_size, latent] (CPU_MLA,
                  AMX_MLA, and the CUDA ones: FlashMLA, FlashInfer MLA, CUTLASS MLA, Triton MLA); older
                  releases as [num_blocks, block_size, latent]. Token t of block b is row b*block_size + t,
                  any strides. When the backend's kernel block is smaller than vLLM's block (FlashMLA: 64),
                  vLLM hands over kernel blocks: [num_blocks * r, 1, block_size / r, latent], block b being
                  kernel blocks b*r .. b*r + r-1. (Checked against vLLM's CPU MLA cache writes, CPU_MLA's and
                  AMX_MLA's: tests/integration/test_vllm_mla_layout.py.) Packed MLA caches (fp8_ds_mla,
                  per-token scales, DeepSeek-V4's compressed states) are refused at start (connector.vllm.mla).

A kvstore chunk is [num_layers, 2, chunk_tokens, num_kv_heads, head_dim] (MLA: [num_layers, 1, chunk_tokens,
1, latent]); layer l of it, chunk[l] = [planes, chunk_tokens, kv_heads, head_dim], holds blocks
block_ids[0..n) in token order.
KV_FIRST is gpu_kernels' paged layout with one layer, so it goes through gpu_kernels.dispatch (CUDA
kernels when CuPy is there, their torch twin otherwise); the others are strided torch copies, which
run on whichever device the cache is on. On a CPU they go block by block, each piece small enough that
torch runs it on the calling thread (copy_serially): the gather runs on vLLM's step.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import torch

from gpu_kernels import gather_blocks, scatter_blocks
from kvstore.errors import LayoutMismatchError

_TORCH_GRAIN = 32768  # at::internal::GRAIN_SIZE: torch runs an elementwise op of fewer elements on one thread


class PagedKind(enum.Enum):
    """Which of vLLM's per-layer KV cache layouts a tensor has (see the module docstring)."""

    HEAD_PLANES = "head_planes"
    AMX_PLANES = "amx_planes"
    TOKEN_CONCAT = "token_concat"
    KV_FIRST = "kv_first"
    LATENT = "latent"


_CPU_KINDS = {"vec": PagedKind.HEAD_PLANES, "vec16": PagedKind.HEAD_PLANES, "amx": PagedKind.AMX_PLANES}
_CPU_PLANES = (PagedKind.HEAD_PLANES, PagedKind.AMX_PLANES)


def cpu_isa_scope(isa: str | None) -> str:
    """What a chunk's scope adds for vLLM's CPU attention ISA `isa` (None: not the CPU backend, nothing).
    A known ISA's chunks are read into the canonical layout ("cpu-layout/2": chunks that vLLM on an AMX CPU
    wrote before its layout was known here held the packed bytes, and must never be read as canonical);
    another ISA's chunks keep vLLM's own bytes, so they are named by the ISA and only read back by it."""
    if isa is None:
        return ""
    return "cpu-layout/2" if isa in _CPU_KINDS else f"cpu-isa:{isa}"


def detect_latent(cache: torch.Tensor, *, block_size: int, latent_dim: int) -> PagedKind:
    """LATENT for one layer's MLA cache of unpacked `latent_dim`-wide rows (any of vLLM's shapes for it: module
    docstring); raises LayoutMismatchError naming the shapes it reads."""
    _latent_pages(cache, block_size, latent_dim)
    return PagedKind.LATENT


def detect_kind(cache: torch.Tensor, *, block_size: int, num_kv_heads: int, head_dim: int,
                cpu_isa: str | None) -> PagedKind:
    """The layout of one layer's cache tensor. The 4-d layouts share a shape; `cpu_isa` (the ISA of vLLM's
    CPU attention backend, None for the other backends) tells them apart. Raises LayoutMismatchError."""
    shape = tuple(cache.shape)
    if len(shape) == 5 and shape[0] == 2 and shape[2:] == (block_size, num_kv_heads, head_dim):
        return PagedKind.KV_FIRST
    if len(shape) == 4 and shape[1:] == (num_kv_heads, block_size, 2 * head_dim):
        return PagedKind.TOKEN_CONCAT if cpu_isa is None else _CPU_KINDS.get(cpu_isa, PagedKind.HEAD_PLANES)
    raise LayoutMismatchError(
        f"vLLM KV cache tensor {shape} is neither [blocks, {num_kv_heads}, {block_size}, {2 * head_dim}] nor "
        f"[2, blocks, {block_size}, {num_kv_heads}, {head_dim}]; the model config and the cache disagree")


def _latent_pages(cache: torch.Tensor, block_size: int, latent_dim: int) -> torch.Tensor:
    """An MLA cache as [num_blocks, r, block_size / r, latent] (r kernel blocks per vLLM block; a view)."""
    shape = tuple(cache.shape)
    rows = cache[:, 0] if cache.dim() == 4 and shape[1] == 1 else cache
    if rows.dim() != 3 or rows.shape[2] != latent_dim or block_size % rows.shape[1] or rows.shape[0] % (
            block_size // rows.shape[1]):
        raise LayoutMismatchError(
            f"vLLM MLA cache tensor {shape} is neither [blocks, 1, {block_size}, {latent_dim}] nor [blocks, "
            f"{block_size}, {latent_dim}] (nor kernel blocks that split {block_size}); kvstore reads unpacked MLA "
            f"latents of kv_lora_rank + rope dims = {latent_dim}")
    return rows.unflatten(0, (-1, block_size // rows.shape[1]))


def _check_latent(cache: torch.Tensor, block_ids: Sequence[int], layer_chunk: torch.Tensor) -> torch.Tensor:
    if layer_chunk.dim() != 4 or layer_chunk.shape[0] != 1 or layer_chunk.shape[2] != 1:
        raise LayoutMismatchError(f"an MLA chunk layer is [1, tokens, 1, latent], got {tuple(layer_chunk.shape)}")
    tokens, latent = layer_chunk.shape[1], layer_chunk.shape[3]
    if not block_ids or tokens % len(block_ids):
        raise LayoutMismatchError(f"{len(block_ids)} blocks do not fill a {tokens}-token chunk")
    if cache.dtype != layer_chunk.dtype:
        raise LayoutMismatchError(f"dtype mismatch: vLLM cache {cache.dtype}, chunk {layer_chunk.dtype}")
    return _latent_pages(cache, tokens // len(block_ids), latent)


def _copy_latent(pages: torch.Tensor, block_ids: Sequence[int], layer_chunk: torch.Tensor, *, to_cache: bool) -> None:
    """Blocks `block_ids` of `pages` ([blocks, r, n, latent]) <-> the chunk layer [1, tokens, 1, latent]."""
    rows = layer_chunk.view(len(block_ids), *pages.shape[1:])
    if pages.device.type == "cpu":  # block by block on the calling thread (copy_serially)
        for i, block in enumerate(block_ids):
            if to_cache:
                copy_serially(pages[block], rows[i])
            else:
                copy_serially(rows[i], pages[block])
        return
    ids = torch.as_tensor(list(block_ids), dtype=torch.long, device=pages.device)  # one indexed copy on the GPU
    if to_cache:
        pages.index_copy_(0, ids, rows.to(pages.device))
    else:
        rows.copy_(pages.index_select(0, ids))


def _check(cache: torch.Tensor, kind: PagedKind, block_ids: Sequence[int], layer_chunk: torch.Tensor) -> int:
    if layer_chunk.dim() != 4 or layer_chunk.shape[0] != 2:
        raise LayoutMismatchError(f"a chunk layer is [2, tokens, heads, dim], got {tuple(layer_chunk.shape)}")
    _, tokens, heads, dim = layer_chunk.shape
    block_size = cache.shape[2]
    if tokens != len(block_ids) * block_size:
        raise LayoutMismatchError(f"{len(block_ids)} blocks of {block_size} tokens do not fill a {tokens}-token chunk")
    if kind is not PagedKind.KV_FIRST and tuple(cache.shape[1:]) != (heads, block_size, 2 * dim):
        raise LayoutMismatchError(f"cache {tuple(cache.shape)} does not match chunk heads={heads} dim={dim}")
    if kind is PagedKind.AMX_PLANES and (block_size % 16 or dim % 16):
        raise LayoutMismatchError(f"vLLM's AMX cache layout needs block_size and head_dim multiples of 16, got "
                                  f"{block_size} and {dim}")
    if cache.dtype != layer_chunk.dtype:
        raise LayoutMismatchError(f"dtype mismatch: vLLM cache {cache.dtype}, chunk {layer_chunk.dtype}")
    return block_size


def gather_layer(cache: torch.Tensor, kind: PagedKind, block_ids: Sequence[int], out: torch.Tensor) -> torch.Tensor:
    """Copy blocks `block_ids` of one layer's cache into `out` = chunk[l] [planes, tokens, heads, dim] (contiguous)."""
    if kind is PagedKind.LATENT:
        _copy_latent(_check_latent(cache, block_ids, out), block_ids, out, to_cache=False)
        return out
    block_size = _check(cache, kind, block_ids, out)
    if kind is PagedKind.KV_FIRST:
        gather_blocks(cache.unsqueeze(0), block_ids, out.unsqueeze(0))
        return out
    n, (_, _, heads, dim) = len(block_ids), out.shape
    if cache.device.type == "cpu" or kind in _CPU_PLANES:  # block by block (copy_serially on a CPU)
        keys, values = out[0].view(n, block_size, heads, dim), out[1].view(n, block_size, heads, dim)
        for i, block in enumerate(block_ids):
            for chunk_part, cache_part in _block_pairs(cache, kind, block, keys[i], values[i]):
                copy_serially(chunk_part, cache_part)
        return out
    ids = torch.as_tensor(list(block_ids), dtype=torch.long, device=cache.device)
    pages = cache.index_select(0, ids)  # [n, heads, block_size, 2 * dim], contiguous
    source = pages.view(n, heads, block_size, 2, dim).permute(3, 0, 2, 1, 4)
    out.view(2, n, block_size, heads, dim).copy_(source)
    return out


def _block_pairs(cache: torch.Tensor, kind: PagedKind, block: int, keys: torch.Tensor,
                 values: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """(chunk view, cache view) of one block's K, then of its V, each pair the same shape and element for element
    the same (token, head, dim); `keys` and `values` are the block's [block_size, heads, dim] in the chunk."""
    block_size, heads, dim = keys.shape
    if kind is PagedKind.TOKEN_CONCAT:
        pair = cache[block].unflatten(-1, (2, dim))  # [heads, block_size, 2, dim]
        return (keys, pair[:, :, 0].permute(1, 0, 2)), (values, pair[:, :, 1].permute(1, 0, 2))
    flat = cache[block].view(heads, 2 * block_size * dim)  # a CPU cache is contiguous per block
    k_plane, v_plane = flat[:, :block_size * dim], flat[:, block_size * dim:]
    if kind is PagedKind.HEAD_PLANES:
        return ((keys, k_plane.view(heads, dim, block_size).permute(2, 0, 1)),
                (values, v_plane.view(heads, block_size, dim).permute(1, 0, 2)))
    # AMX: K [token group g, dim pair p, token t, s] holds (token 16g + t, dim 2p + s); V [dim group e, token pair q,
    # dim d, s] holds (token 2q + s, dim 16e + d). Both sides seen as (token-major, head, dim-minor) pieces.
    k_cache = k_plane.view(heads, block_size // 16, dim // 2, 16, 2).permute(1, 3, 0, 2, 4)
    v_cache = v_plane.view(heads, dim // 16, block_size // 2, 16, 2).permute(2, 4, 0, 1, 3)
    return ((keys.view(block_size // 16, 16, heads, dim // 2, 2), k_cache),
            (values.view(block_size // 2, 2, heads, dim // 16, 16), v_cache))


def copy_serially(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src) in pieces below torch's parallel grain, so no piece goes to its intra-op thread team.
    On a CPU that vLLM's forward pass (and other processes) keep busy, a copy handed to the team waits for
    it: measured 20-30 ms per copy on 2 loaded cores (150 ms per 2 MiB chunk), where the same copies done
    on the calling thread take well under 1 ms."""
    if dst.numel() < _TORCH_GRAIN or dst.dim() == 0 or dst.device.type != "cpu":
        dst.copy_(src)
        return
    for dst_part, src_part in zip(dst, src, strict=True):
        copy_serially(dst_part, src_part)


def scatter_layer(src: torch.Tensor, kind: PagedKind, block_ids: Sequence[int], cache: torch.Tensor) -> torch.Tensor:
    """The reverse of `gather_layer`: chunk[l] -> blocks `block_ids` of one layer's cache, in place."""
    if kind is PagedKind.LATENT:
        _copy_latent(_check_latent(cache, block_ids, src), block_ids, src, to_cache=True)
        return cache
    block_size = _check(cache, kind, block_ids, src)
    if kind is PagedKind.KV_FIRST:
        scatter_blocks(src.unsqueeze(0).contiguous(), block_ids, cache.unsqueeze(0))
        return cache
    n, (_, _, heads, dim) = len(block_ids), src.shape
    keys = src[0].to(cache.device).view(n, block_size, heads, dim)
    values = src[1].to(cache.device).view(n, block_size, heads, dim)
    for i, block in enumerate(block_ids):
        for chunk_part, cache_part in _block_pairs(cache, kind, block, keys[i], values[i]):
            copy_serially(cache_part, chunk_part)
    return cache


def gather_chunk(caches: Sequence[torch.Tensor], kind: PagedKind, block_ids: Sequence[int],
                 out_chunk: torch.Tensor) -> torch.Tensor:
    """All layers: caches[l] blocks `block_ids` -> out_chunk [layers, planes, tokens, heads, dim]."""
    if len(caches) != out_chunk.shape[0]:
        raise LayoutMismatchError(f"{len(caches)} layer caches for a {out_chunk.shape[0]}-layer chunk")
    for layer, cache in enumerate(caches):
        gather_layer(cache, kind, block_ids, out_chunk[layer])
    return out_chunk


def scatter_chunk(chunk: torch.Tensor, kind: PagedKind, block_ids: Sequence[int],
                  caches: Sequence[torch.Tensor]) -> None:
    """All layers: chunk [layers, planes, tokens, heads, dim] -> blocks `block_ids` of caches[l]."""
    if len(caches) != chunk.shape[0]:
        raise LayoutMismatchError(f"{len(caches)} layer caches for a {chunk.shape[0]}-layer chunk")
    for layer, cache in enumerate(caches):
        scatter_layer(chunk[layer], kind, block_ids, cache)
