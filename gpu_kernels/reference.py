"""Pure-torch gather/scatter of KV pages: the CPU path and the oracle the CUDA kernels are tested against.

Paged KV (the engine's cache) and a chunk (the store's unit), both contiguous::

    paged_kv:  [num_layers, num_planes, num_blocks, page_size, num_kv_heads, head_dim]
    chunk:     [num_layers, num_planes, chunk_tokens, num_kv_heads, head_dim]
               chunk_tokens = len(block_ids) * page_size; tokens i*page_size.. of the chunk
               are page block_ids[i]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvstore.errors import LayoutMismatchError


def check_shapes(paged_kv: torch.Tensor, block_ids: Sequence[int] | torch.Tensor, chunk: torch.Tensor) -> int:
    """Validate a gather/scatter pair of tensors; return the number of pages. Raises LayoutMismatchError."""
    if paged_kv.dim() != 6 or chunk.dim() != 5:
        raise LayoutMismatchError(
            f"paged_kv must be [layers, planes, blocks, page, heads, dim] and chunk [layers, planes, tokens, heads, dim]; "
            f"got {tuple(paged_kv.shape)} and {tuple(chunk.shape)}"
        )
    layers, planes, num_blocks, page_size, heads, dim = paged_kv.shape
    num_pages = len(block_ids)
    want = (layers, planes, num_pages * page_size, heads, dim)
    if tuple(chunk.shape) != want:
        raise LayoutMismatchError(
            f"chunk shape {tuple(chunk.shape)} does not hold {num_pages} pages of {page_size} tokens: expected {want}"
        )
    if paged_kv.dtype != chunk.dtype:
        raise LayoutMismatchError(f"dtype mismatch: paged_kv {paged_kv.dtype}, chunk {chunk.dtype}; convert one first")
    ids = torch.as_tensor(block_ids, dtype=torch.long)
    if num_pages and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
        raise LayoutMismatchError(f"block ids must lie in [0, {num_blocks}), got {ids.tolist()}")
    return num_pages


def _ids(block_ids: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(block_ids, dtype=torch.long).to(device)


def gather_blocks(paged_kv: torch.Tensor, block_ids: Sequence[int] | torch.Tensor, out_chunk: torch.Tensor) -> torch.Tensor:
    """Copy pages `block_ids` of `paged_kv` into `out_chunk` (any device); returns `out_chunk`."""
    num_pages = check_shapes(paged_kv, block_ids, out_chunk)
    if not out_chunk.is_contiguous():
        raise LayoutMismatchError("out_chunk must be contiguous; pass a fresh torch.empty(chunk_shape) buffer")
    layers, planes, _, page_size, heads, dim = paged_kv.shape
    if out_chunk.device == paged_kv.device:  # straight into the output: no temporary (~7x faster on CPU)
        torch.index_select(paged_kv, 2, _ids(block_ids, paged_kv.device),
                           out=out_chunk.view(layers, planes, num_pages, page_size, heads, dim))
    else:
        pages = paged_kv.index_select(2, _ids(block_ids, paged_kv.device))
        out_chunk.view(layers, planes, num_pages, page_size, heads, dim).copy_(pages)
    return out_chunk


def scatter_blocks(chunk: torch.Tensor, block_ids: Sequence[int] | torch.Tensor, paged_kv: torch.Tensor) -> torch.Tensor:
    """Copy `chunk` into pages `block_ids` of `paged_kv` (in place); returns `paged_kv`."""
    num_pages = check_shapes(paged_kv, block_ids, chunk)
    layers, planes, _, page_size, heads, dim = paged_kv.shape
    src = chunk.to(paged_kv.device).reshape(layers, planes, num_pages, page_size, heads, dim)
    for i, block in enumerate(torch.as_tensor(block_ids, dtype=torch.long).tolist()):  # page copies beat index_copy_
        paged_kv[:, :, block].copy_(src[:, :, i])
    return paged_kv
