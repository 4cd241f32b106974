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
    cpu_isa_scope,
    detect_kind,
    gather_chunk,
    gather_layer,
    scatter_chunk,
    scatter_layer,
)
from connector.vllm.scope import vllm_identity
from kvstore.errors import LayoutMismatchError
from kvstore.layout import KVLayout

LAYERS, HEADS, DIM, BLOCK, NUM_BLOCKS = 3, 2, 8, 4, 10
AMX_BLOCK, AMX_DIM = 16, 32  # vLLM's AMX layout packs K in 16-token groups and V in 16-dim groups
KV_KINDS = [kind for kind in PagedKind if kind is not PagedKind.LATENT]  # K and V planes; MLA's latent: test_vllm_paged_mla.py


def geometry(kind: PagedKind) -> tuple[int, int]:
    """(block_size, head_dim) of the test caches of `kind`."""
    return (AMX_BLOCK, AMX_DIM) if kind is PagedKind.AMX_PLANES else (BLOCK, DIM)


def empty_cache(kind: PagedKind, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    block, dim = geometry(kind)
    if kind is PagedKind.KV_FIRST:
        return torch.zeros(2, NUM_BLOCKS, block, HEADS, dim, dtype=dtype)
    if kind is PagedKind.TOKEN_CONCAT:  # flash-attn's physical order [blocks, block_size, heads, 2*dim], seen HND
        return torch.zeros(NUM_BLOCKS, block, HEADS, 2 * dim, dtype=dtype).transpose(1, 2)
    return torch.zeros(NUM_BLOCKS, HEADS, block, 2 * dim, dtype=dtype)


def cpu_positions(kind: PagedKind, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where vLLM's CPU kernel puts token `offset`'s K and V dims 0..dim-1 in a (block, head)'s flat storage."""
    block, dim = geometry(kind)
    d = torch.arange(dim)
    if kind is PagedKind.HEAD_PLANES:  # "vec": K transposed [dim, block], then V [block, dim]
        return d * block + offset, block * dim + offset * dim + d
    # "amx": K [token group, dim pair, 16 tokens, 2 dims], then V [dim group, token pair, 16 dims, 2 tokens]
    k = (offset // 16) * 16 * dim + (d // 2) * 32 + (offset % 16) * 2 + d % 2
    v = block * dim + (d // 16) * block * 16 + (offset // 2) * 32 + (d % 16) * 2 + offset % 2
    return k, v


def write_token(cache: torch.Tensor, kind: PagedKind, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Where vLLM's reshape_and_cache puts one token's K and V ([heads, dim] each)."""
    block_size, dim = geometry(kind)
    block, offset = divmod(slot, block_size)
    for h in range(HEADS):
        if kind is PagedKind.KV_FIRST:
            cache[0, block, offset, h] = k[h]
            cache[1, block, offset, h] = v[h]
        elif kind is PagedKind.TOKEN_CONCAT:
            cache[block, h, offset, :dim] = k[h]
            cache[block, h, offset, dim:] = v[h]
        else:
            flat = cache.view(NUM_BLOCKS, HEADS, 2 * block_size * dim)
            k_at, v_at = cpu_positions(kind, offset)
            flat[block, h, k_at] = k[h]
            flat[block, h, v_at] = v[h]


def read_token(cache: torch.Tensor, kind: PagedKind, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
    block_size, dim = geometry(kind)
    block, offset = divmod(slot, block_size)
    if kind is PagedKind.KV_FIRST:
        return cache[0, block, offset], cache[1, block, offset]
    if kind is PagedKind.TOKEN_CONCAT:
        return cache[block, :, offset, :dim], cache[block, :, offset, dim:]
    flat = cache.view(NUM_BLOCKS, HEADS, 2 * block_size * dim)
    k_at, v_at = cpu_positions(kind, offset)
    return flat[block][:, k_at], flat[block][:, v_at]


@pytest.mark.parametrize("kind", KV_KINDS)
def test_gather_puts_each_token_where_the_chunk_expects_it(kind: PagedKind) -> None:
    block_size, dim = geometry(kind)
    block_ids = [7, 2, 5]  # out of order on purpose: token order follows the list, not the ids
    tokens = len(block_ids) * block_size
    kv = torch.randn(LAYERS, 2, tokens, HEADS, dim, generator=torch.Generator().manual_seed(1))
    caches = [empty_cache(kind) for _ in range(LAYERS)]
    for layer, cache in enumerate(caches):
        for t in range(tokens):
            slot = block_ids[t // block_size] * block_size + t % block_size
            write_token(cache, kind, slot, kv[layer, 0, t], kv[layer, 1, t])
    chunk = torch.empty(LAYERS, 2, tokens, HEADS, dim)
    gather_chunk(caches, kind, block_ids, chunk)
    assert torch.equal(chunk, kv)


@pytest.mark.parametrize("kind", KV_KINDS)
def test_scatter_writes_only_the_named_blocks(kind: PagedKind) -> None:
    block_size, dim = geometry(kind)
    block_ids = [1, 8]
    tokens = len(block_ids) * block_size
    chunk = torch.randn(LAYERS, 2, tokens, HEADS, dim, generator=torch.Generator().manual_seed(2))
    caches = [empty_cache(kind).fill_(-1.0) for _ in range(LAYERS)]
    scatter_chunk(chunk, kind, block_ids, caches)
    for layer, cache in enumerate(caches):
        for t in range(tokens):
            k, v = read_token(cache, kind, block_ids[t // block_size] * block_size + t % block_size)
            assert torch.equal(k, chunk[layer, 0, t]) and torch.equal(v, chunk[layer, 1, t])
        untouched = [b for b in range(NUM_BLOCKS) if b not in block_ids]
        for b in untouched:
            for t in range(block_size):
                k, v = read_token(cache, kind, b * block_size + t)
                assert bool((k == -1).all()) and bool((v == -1).all())


@pytest.mark.parametrize("kind", KV_KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_trip_is_byte_identical(kind: PagedKind, dtype: torch.dtype) -> None:
    block_size, dim = geometry(kind)
    source = empty_cache(kind, dtype).normal_(generator=torch.Generator().manual_seed(3))
    chunk = torch.empty(2, 3 * block_size, HEADS, dim, dtype=dtype)
    gather_layer(source, kind, [4, 0, 9], chunk)
    target = empty_cache(kind, dtype)
    scatter_layer(chunk, kind, [1, 2, 3], target)
    for src_block, dst_block in zip([4, 0, 9], [1, 2, 3], strict=True):
        for t in range(block_size):
            for a, b in zip(read_token(source, kind, src_block * block_size + t),
                            read_token(target, kind, dst_block * block_size + t), strict=True):
                assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_detect_kind_reads_the_layouts_and_refuses_others() -> None:
    dims = {"block_size": BLOCK, "num_kv_heads": HEADS, "head_dim": DIM}
    assert detect_kind(empty_cache(PagedKind.KV_FIRST), **dims, cpu_isa=None) is PagedKind.KV_FIRST
    assert detect_kind(empty_cache(PagedKind.HEAD_PLANES), **dims, cpu_isa="vec") is PagedKind.HEAD_PLANES
    assert detect_kind(empty_cache(PagedKind.HEAD_PLANES), **dims, cpu_isa="vec16") is PagedKind.HEAD_PLANES
    assert detect_kind(empty_cache(PagedKind.HEAD_PLANES), **dims, cpu_isa="neon") is PagedKind.HEAD_PLANES
    assert detect_kind(empty_cache(PagedKind.HEAD_PLANES), **dims, cpu_isa="amx") is PagedKind.AMX_PLANES
    assert detect_kind(empty_cache(PagedKind.TOKEN_CONCAT), **dims, cpu_isa=None) is PagedKind.TOKEN_CONCAT
    with pytest.raises(LayoutMismatchError, match="neither"):
        detect_kind(torch.zeros(NUM_BLOCKS, BLOCK, HEADS, DIM), **dims, cpu_isa="vec")


def test_cpu_chunks_are_scoped_by_whether_their_layout_is_known() -> None:
    """Chunks read into the canonical layout share a tag across CPU ISAs (an AMX and an AVX-512 server share);
    an ISA whose layout is not known here keeps vLLM's bytes, so its chunks are named by it; off the CPU, none."""
    assert cpu_isa_scope(None) == ""
    assert cpu_isa_scope("vec") == cpu_isa_scope("vec16") == cpu_isa_scope("amx") == "cpu-layout/2"
    assert cpu_isa_scope("neon") == "cpu-isa:neon" != cpu_isa_scope("vsx")
    layout = KVLayout(num_layers=2, num_kv_heads=HEADS, head_dim=DIM, dtype="bfloat16", chunk_tokens=16)
    roots = {isa: vllm_identity("m", layout, cpu_isa=isa).scope().root(b"r" * 16)
             for isa in (None, "vec", "amx", "neon", "vsx")}
    assert roots["vec"] == roots["amx"]
    assert len({roots[None], roots["vec"], roots["neon"], roots["vsx"]}) == 4


def test_the_amx_layout_needs_blocks_and_dims_of_16() -> None:
    cache = torch.zeros(NUM_BLOCKS, HEADS, 8, 2 * 32)
    with pytest.raises(LayoutMismatchError, match="multiples of 16"):
        gather_layer(cache, PagedKind.AMX_PLANES, [1], torch.empty(2, 8, HEADS, 32))


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


@pytest.mark.parametrize("kind", [PagedKind.HEAD_PLANES, PagedKind.AMX_PLANES, PagedKind.TOKEN_CONCAT])
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
