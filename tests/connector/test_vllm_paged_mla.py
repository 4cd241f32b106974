"""connector/vllm/paged.py's MLA latent caches <-> kvstore's MLA chunks, and the MLA start-up checks.

The oracle writes each token's latent where vLLM's MLA cache writes put it (row slot = block * block_size + offset
of the cache seen as [rows, latent], as CPU_MLA's do_kv_cache_update and CUDA's concat_and_cache_mla do), one token
at a time, so the test does not reuse the code it checks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from connector.deadlines import Deadlines
from connector.embedded_store import EmbeddedStore
from connector.vllm.mla import check_mla, cpu_rope_warning
from connector.vllm.paged import PagedKind, detect_latent, gather_chunk, gather_layer, scatter_chunk, scatter_layer
from connector.vllm.plan import TransferSpec
from connector.vllm.scope import vllm_identity
from connector.vllm.transfer import PagedTransfer
from kvstore.config import StoreConfig
from kvstore.errors import ConfigError, LayoutMismatchError
from kvstore.kv_scope import shard_keys, shard_role
from kvstore.layout import AttentionKind, KVLayout
from kvstore.store import TieredStore

LAYERS, BLOCK, LATENT, NUM_BLOCKS = 3, 8, 40, 10


def latent_cache(shape: str, dtype: torch.dtype = torch.bfloat16, kernel_blocks: int = 1) -> torch.Tensor:
    """One layer's MLA cache as vLLM hands it over: "4d" [blocks, 1, block, latent] (vLLM 0.32, every backend),
    "3d" [blocks, block, latent] (older releases), "strided" a layer view of a cache whose blocks interleave the
    layers (vLLM's BLHNC layouts); kernel_blocks r > 1: [blocks * r, 1, block / r, latent]."""
    if shape == "strided":
        whole = torch.zeros(NUM_BLOCKS, 2, 1, BLOCK, LATENT, dtype=dtype)  # [B, L, H, N, C]
        return whole[:, 1]
    if shape == "3d":
        return torch.zeros(NUM_BLOCKS, BLOCK, LATENT, dtype=dtype)
    return torch.zeros(NUM_BLOCKS * kernel_blocks, 1, BLOCK // kernel_blocks, LATENT, dtype=dtype)


def rows(cache: torch.Tensor) -> torch.Tensor:
    """The cache as vLLM's MLA cache writes address it: row b * block_size + t is token t of block b."""
    return cache.reshape(-1, LATENT) if cache.is_contiguous() else cache[:, 0].reshape(-1, LATENT)


SHAPES = [("4d", 1), ("3d", 1), ("4d", 2), ("4d", 4)]


@pytest.mark.parametrize(("shape", "kernel_blocks"), SHAPES)
def test_gather_puts_each_token_latent_where_the_chunk_expects_it(shape: str, kernel_blocks: int) -> None:
    block_ids = [7, 2, 5]  # out of order: token order follows the list
    tokens = len(block_ids) * BLOCK
    latents = torch.randn(LAYERS, 1, tokens, 1, LATENT, generator=torch.Generator().manual_seed(1)).bfloat16()
    caches = [latent_cache(shape, kernel_blocks=kernel_blocks) for _ in range(LAYERS)]
    for layer, cache in enumerate(caches):
        flat = rows(cache)
        for t in range(tokens):
            flat[block_ids[t // BLOCK] * BLOCK + t % BLOCK] = latents[layer, 0, t, 0]
    assert detect_latent(caches[0], block_size=BLOCK, latent_dim=LATENT) is PagedKind.LATENT
    chunk = torch.empty(LAYERS, 1, tokens, 1, LATENT, dtype=torch.bfloat16)
    gather_chunk(caches, PagedKind.LATENT, block_ids, chunk)
    assert torch.equal(chunk.view(torch.int16), latents.view(torch.int16))


@pytest.mark.parametrize(("shape", "kernel_blocks"), [*SHAPES, ("strided", 1)])
def test_scatter_writes_only_the_named_blocks_and_round_trips(shape: str, kernel_blocks: int) -> None:
    source = latent_cache(shape, kernel_blocks=kernel_blocks)
    source.copy_(torch.randn(source.shape, generator=torch.Generator().manual_seed(2)))
    chunk = torch.empty(1, 3 * BLOCK, 1, LATENT, dtype=torch.bfloat16)
    gather_layer(source, PagedKind.LATENT, [4, 0, 9], chunk)
    target = latent_cache(shape, kernel_blocks=kernel_blocks).fill_(-1)
    scatter_layer(chunk, PagedKind.LATENT, [1, 2, 3], target)
    src_rows, dst_rows = rows(source).view(NUM_BLOCKS, BLOCK, LATENT), rows(target).view(NUM_BLOCKS, BLOCK, LATENT)
    for src_block, dst_block in zip([4, 0, 9], [1, 2, 3], strict=True):
        assert torch.equal(dst_rows[dst_block].view(torch.int16), src_rows[src_block].view(torch.int16))
    for untouched in (0, 4, 5, 6, 7, 8, 9):
        assert bool((dst_rows[untouched] == -1).all())


def test_a_whole_chunk_goes_back_into_other_blocks() -> None:
    caches = [latent_cache("4d") for _ in range(LAYERS)]
    for cache in caches:
        cache.normal_(generator=torch.Generator().manual_seed(3))
    chunk = torch.empty(LAYERS, 1, 2 * BLOCK, 1, LATENT, dtype=torch.bfloat16)
    gather_chunk(caches, PagedKind.LATENT, [6, 3], chunk)
    others = [latent_cache("4d") for _ in range(LAYERS)]
    scatter_chunk(chunk, PagedKind.LATENT, [0, 8], others)
    for cache, other in zip(caches, others, strict=True):
        assert torch.equal(other[0], cache[6]) and torch.equal(other[8], cache[3])


def test_packed_or_foreign_mla_caches_are_refused_with_the_shapes_read() -> None:
    packed = torch.zeros(NUM_BLOCKS, 1, BLOCK, 656, dtype=torch.uint8)  # FlashMLA's fp8_ds_mla: 656 bytes a token
    with pytest.raises(LayoutMismatchError, match=r"unpacked MLA latents of kv_lora_rank \+ rope dims = 40"):
        detect_latent(packed, block_size=BLOCK, latent_dim=LATENT)
    with pytest.raises(LayoutMismatchError, match="neither"):  # K and V planes: not a latent
        detect_latent(torch.zeros(NUM_BLOCKS, 2, BLOCK, LATENT), block_size=BLOCK, latent_dim=LATENT)
    with pytest.raises(LayoutMismatchError, match="dtype"):
        gather_layer(latent_cache("4d"), PagedKind.LATENT, [1], torch.empty(1, BLOCK, 1, LATENT))


@pytest.mark.parametrize(("setting", "message"), [
    ({"cache_dtype": "fp8"}, "set kv_cache_dtype='auto'"),
    ({"cache_dtype": "fp8_ds_mla"}, "set kv_cache_dtype='auto'"),
    ({"dcp_size": 2}, "set decode_context_parallel_size=1"),
    ({"pcp_size": 4}, "set prefill_context_parallel_size=1"),
    ({"hf_config": {"model_type": "deepseek_v32", "index_topk": 2048}}, "DeepSeek sparse attention"),
])
def test_mla_settings_that_pack_or_split_the_latent_are_refused_in_one_line(setting: dict[str, object],
                                                                           message: str) -> None:
    values: dict[str, object] = {"model": "deepseek-ai/DeepSeek-V3", "cache_dtype": "auto", "dcp_size": 1,
                                 "pcp_size": 1, "hf_config": {"model_type": "deepseek_v3"}, **setting}
    with pytest.raises(ConfigError, match=message) as caught:
        check_mla(**values)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value) and "DeepSeek-V3" in str(caught.value)
    check_mla(model="deepseek-ai/DeepSeek-V3", cache_dtype="auto", dcp_size=1, pcp_size=1,  # the dense model passes
              hf_config={"model_type": "deepseek_v3", "kv_lora_rank": 512, "index_topk": None})


def test_mla_keys_name_no_tensor_parallel_size_and_only_rank_zero_writes() -> None:
    """Every TP rank of an MLA model holds the same latent: a TP=8 server hits what a TP=1 server stored, and of
    the 8 ranks one saves. MHA ranks hold their own heads: own keys per rank and per TP size, each rank saves."""
    mla = KVLayout(num_layers=61, num_kv_heads=1, head_dim=576, chunk_tokens=64, kind=AttentionKind.MLA)
    mha = KVLayout(num_layers=32, num_kv_heads=1, head_dim=128, chunk_tokens=64)
    root = b"r" * 16
    mla_roots = {tp: vllm_identity("m", mla, tp_size=tp).scope().root(root) for tp in (1, 2, 8)}
    mha_roots = {tp: vllm_identity("m", mha, tp_size=tp).scope().root(root) for tp in (1, 2, 8)}
    assert len(set(mla_roots.values())) == 1 and len(set(mha_roots.values())) == 3
    roles = [shard_role(AttentionKind.MLA, 8, rank) for rank in range(8)]
    assert [r.writes for r in roles] == [True] + [False] * 7
    keys = [b"k" * 16, b"l" * 16]
    assert all(shard_keys(keys, r.key_tp_rank) == keys for r in roles), "every rank reads rank 0's keys"
    mha_roles = [shard_role(AttentionKind.MHA, 8, rank) for rank in range(8)]
    assert all(r.writes for r in mha_roles)
    assert len({tuple(shard_keys(keys, r.key_tp_rank)) for r in mha_roles}) == 8


def test_vllms_cpu_rope_kernel_is_warned_about_unless_its_torch_rope_runs() -> None:
    assert "custom_ops=['all', '-rotary_embedding']" in str(cpu_rope_warning(["all"]))
    assert cpu_rope_warning(["none", "+rotary_embedding"]) is not None
    assert cpu_rope_warning(["all", "-rotary_embedding"]) is None
    assert cpu_rope_warning(["none"]) is None


def test_an_mla_rank_that_does_not_write_loads_what_rank_zero_saved(tmp_path: Path) -> None:
    """TP ranks 0 and 1 of an MLA model through PagedTransfer over one real store: rank 1 saves nothing, and loads
    rank 0's chunks (the same keys) byte-identical into its own blocks."""
    layout = KVLayout(num_layers=LAYERS, num_kv_heads=1, head_dim=LATENT, dtype="bfloat16", chunk_tokens=2 * BLOCK,
                      kind=AttentionKind.MLA)
    config = StoreConfig.embedded(layout=layout, root_dir=tmp_path, host_bytes=16 * layout.chunk_bytes,
                                  nvme_bytes=16 * (layout.chunk_bytes + 8192))
    with TieredStore(config) as tiered:
        store = EmbeddedStore(tiered, Deadlines(), "test")
        ranks = [shard_role(AttentionKind.MLA, 2, rank) for rank in (0, 1)]
        source = [latent_cache("4d").normal_(generator=torch.Generator().manual_seed(5)) for _ in range(LAYERS)]
        target = [latent_cache("4d") for _ in range(LAYERS)]
        rank0, rank1 = (PagedTransfer(store, caches, PagedKind.LATENT, BLOCK, tp_rank=role.key_tp_rank,
                                      writes=role.writes) for caches, role in zip((source, target), ranks, strict=True))
        keys = (b"a" * 16, b"b" * 16)
        spec = TransferSpec("r", keys, 0, 0, 4 * BLOCK, (6, 1, 3, 8))
        rank1.save([spec])
        rank1.wait()
        assert tiered.lookup_keys(list(keys)) == 0, "rank 1 writes nothing"
        rank0.save([spec])
        rank0.wait()
        assert tiered.lookup_keys(list(keys)) == 2
        assert rank1.load(TransferSpec("r", keys, 0, 0, 4 * BLOCK, (2, 4, 5, 7))) == set()
        for src, dst in zip(source, target, strict=True):
            assert torch.equal(dst[[2, 4, 5, 7]].view(torch.int16), src[[6, 1, 3, 8]].view(torch.int16))
