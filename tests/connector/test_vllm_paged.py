"""connector/vllm/paged.py: vLLM's CPU and CUDA per-layer KV layouts <-> kvstore chunks, on real tensors.

The oracle writes each token's K and V where vLLM's cache-write kernels put them (slot = block * block_size
+ offset), one element at a time, so the test does not reuse the code it checks.
"""

from __future__ import annotations

import pytest
import torch

from connector.vllm.paged import (
    PagedKind,
    copy_serially,
    detect_kind,
    gather_chunk,
    gather_layer,
    scatter_chunk,
    scatter_layer,
)
from kvstore.errors import LayoutMismatchError

LAYERS, HEADS, DIM, BLOCK, NUM_BLOCKS = 3, 2, 8, 4, 10


def empty_cache(kind: PagedKind, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if kind is PagedKind.KV_FIRST:
        return torch.zeros(2, NUM_BLOCKS, BLOCK, HEADS, DIM, dtype=dtype)
    if kind is PagedKind.TOKEN_CONCAT:  # flash-attn's physical order [blocks, block_size, heads, 2*dim], seen HND
        return torch.zeros(NUM_BLOCKS, BLOCK, HEADS, 2 * DIM, dtype=dtype).transpose(1, 2)
    return torch.zeros(NUM_BLOCKS, HEADS, BLOCK, 2 * DIM, dtype=dtype)


def write_token(cache: torch.Tensor, kind: PagedKind, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Where vLLM's reshape_and_cache puts one token's K and V ([heads, dim] each)."""
    block, offset = divmod(slot, BLOCK)
    for h in range(HEADS):
        if kind is PagedKind.KV_FIRST:
            cache[0, block, offset, h] = k[h]
            cache[1, block, offset, h] = v[h]
        elif kind is PagedKind.TOKEN_CONCAT:
            cache[block, h, offset, :DIM] = k[h]
            cache[block, h, offset, DIM:] = v[h]
        else:  # vLLM's CPU kernel ("vec" ISA): per (block, head) K transposed [dim, block], then V [block, dim]
            flat = cache.view(NUM_BLOCKS, HEADS, 2 * BLOCK * DIM)
            flat[block, h, offset:BLOCK * DIM:BLOCK] = k[h]
            flat[block, h, BLOCK * DIM + offset * DIM:BLOCK * DIM + (offset + 1) * DIM] = v[h]


def read_token(cache: torch.Tensor, kind: PagedKind, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
    block, offset = divmod(slot, BLOCK)
    if kind is PagedKind.KV_FIRST:
        return cache[0, block, offset], cache[1, block, offset]
    if kind is PagedKind.TOKEN_CONCAT:
        return cache[block, :, offset, :DIM], cache[block, :, offset, DIM:]
    flat = cache.view(NUM_BLOCKS, HEADS, 2 * BLOCK * DIM)
    return flat[block, :, offset:BLOCK * DIM:BLOCK], flat[block, :, BLOCK * DIM + offset * DIM:BLOCK * DIM + (offset + 1) * DIM]


@pytest.mark.parametrize("kind", list(PagedKind))
def test_gather_puts_each_token_where_the_chunk_expects_it(kind: PagedKind) -> None:
    block_ids = [7, 2, 5]  # out of order on purpose: token order follows the list, not the ids
    tokens = len(block_ids) * BLOCK
    kv = torch.randn(LAYERS, 2, tokens, HEADS, DIM, generator=torch.Generator().manual_seed(1))
    caches = [empty_cache(kind) for _ in range(LAYERS)]
    for layer, cache in enumerate(caches):
        for t in range(tokens):
            write_token(cache, kind, block_ids[t // BLOCK] * BLOCK + t % BLOCK, kv[layer, 0, t], kv[layer, 1, t])
    chunk = torch.empty(LAYERS, 2, tokens, HEADS, DIM)
    gather_chunk(caches, kind, block_ids, chunk)
    assert torch.equal(chunk, kv)


@pytest.mark.parametrize("kind", list(PagedKind))
def test_scatter_writes_only_the_named_blocks(kind: PagedKind) -> None:
    block_ids = [1, 8]
    tokens = len(block_ids) * BLOCK
    chunk = torch.randn(LAYERS, 2, tokens, HEADS, DIM, generator=torch.Generator().manual_seed(2))
    caches = [empty_cache(kind).fill_(-1.0) for _ in range(LAYERS)]
    scatter_chunk(chunk, kind, block_ids, caches)
    for layer, cache in enumerate(caches):
        for t in range(tokens):
            k, v = read_token(cache, kind, block_ids[t // BLOCK] * BLOCK + t % BLOCK)
            assert torch.equal(k, chunk[layer, 0, t]) and torch.equal(v, chunk[layer, 1, t])
        untouched = [b for b in range(NUM_BLOCKS) if b not in block_ids]
        for b in untouched:
            for t in range(BLOCK):
                k, v = read_token(cache, kind, b * BLOCK + t)
                assert bool((k == -1).all()) and bool((v == -1).all())


@pytest.mark.parametrize("kind", list(PagedKind))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_trip_is_byte_identical(kind: PagedKind, dtype: torch.dtype) -> None:
    source = empty_cache(kind, dtype).normal_(generator=torch.Generator().manual_seed(3))
    chunk = torch.empty(2, 3 * BLOCK, HEADS, DIM, dtype=dtype)
    gather_layer(source, kind, [4, 0, 9], chunk)
    target = empty_cache(kind, dtype)
    scatter_layer(chunk, kind, [1, 2, 3], target)
    for src_block, dst_block in zip([4, 0, 9], [1, 2, 3], strict=True):
        for t in range(BLOCK):
            for a, b in zip(read_token(source, kind, src_block * BLOCK + t), read_token(target, kind, dst_block * BLOCK + t),
                            strict=True):
                assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_detect_kind_reads_the_layouts_and_refuses_others() -> None:
    dims = {"block_size": BLOCK, "num_kv_heads": HEADS, "head_dim": DIM}
    assert detect_kind(empty_cache(PagedKind.KV_FIRST), **dims, cpu_backend=False) is PagedKind.KV_FIRST
    assert detect_kind(empty_cache(PagedKind.HEAD_PLANES), **dims, cpu_backend=True) is PagedKind.HEAD_PLANES
    assert detect_kind(empty_cache(PagedKind.TOKEN_CONCAT), **dims, cpu_backend=False) is PagedKind.TOKEN_CONCAT
    with pytest.raises(LayoutMismatchError, match="neither"):
        detect_kind(torch.zeros(NUM_BLOCKS, BLOCK, HEADS, DIM), **dims, cpu_backend=True)


def test_bad_shapes_name_the_problem() -> None:
    kind = PagedKind.HEAD_PLANES
    cache = empty_cache(kind)
    with pytest.raises(LayoutMismatchError, match="do not fill"):
        gather_layer(cache, kind, [1], torch.empty(2, 2 * BLOCK, HEADS, DIM))
    with pytest.raises(LayoutMismatchError, match="dtype"):
        gather_layer(cache, kind, [1], torch.empty(2, BLOCK, HEADS, DIM, dtype=torch.float16))
    with pytest.raises(LayoutMismatchError, match="layer caches"):
        gather_chunk([cache], kind, [1], torch.empty(2, 2, BLOCK, HEADS, DIM))


def test_copy_serially_copies_strided_views_above_the_grain_exactly() -> None:
    """Regression: the gather of a chunk on a loaded CPU took 150 ms in torch's intra-op thread team; it is now
    copied in pieces on the calling thread. The pieces must still add up to the whole copy."""
    source = torch.randn(3, 64, 40, 24, generator=torch.Generator().manual_seed(4)).permute(1, 3, 0, 2)
    target = torch.zeros(64, 24, 3, 40)
    assert source.numel() > 32768 and not source.is_contiguous()
    copy_serially(target, source)
    assert torch.equal(target, source)


@pytest.mark.parametrize("kind", [PagedKind.HEAD_PLANES, PagedKind.TOKEN_CONCAT])
def test_gather_and_scatter_of_blocks_above_the_grain(kind: PagedKind) -> None:
    """A block of 8 heads x 32 tokens x 128 dims (32,768 elements per K plane) goes through copy_serially's split."""
    heads, block, dim, num_blocks = 8, 32, 128, 4
    shape = (num_blocks, block, heads, 2 * dim) if kind is PagedKind.TOKEN_CONCAT else (num_blocks, heads, block, 2 * dim)
    source = torch.randn(*shape, generator=torch.Generator().manual_seed(5))
    source = source.transpose(1, 2) if kind is PagedKind.TOKEN_CONCAT else source
    chunk = torch.empty(2, 2 * block, heads, dim)
    gather_layer(source, kind, [3, 1], chunk)
    if kind is PagedKind.TOKEN_CONCAT:  # [blocks, heads, block, 2*dim] seen HND: token t of block b is [K | V]
        expected_k = source[[3, 1], :, :, :dim].permute(0, 2, 1, 3).reshape(2 * block, heads, dim)
        assert torch.equal(chunk[0], expected_k)
    target = torch.zeros_like(source)
    scatter_layer(chunk, kind, [0, 2], target)
    assert torch.equal(target[0], source[3]) and torch.equal(target[2], source[1])
    assert not target[1].any() and not target[3].any()
