"""vLLM's KV cache groups (its KVCacheConfig) as kvstore group shapes; what kvstore cannot store is refused in one line.

A Mamba / linear-attention group (vLLM's MambaSpec: gated delta net, Mamba2, ...) is stored as its state at each
chunk boundary. vLLM keeps such a state only in "align" mode (prefix caching on), and there only in the block that
ends where a prefill step stops: steps stop at block ends, so a state lies at a chunk boundary whenever a chunk is
one block (chunk_tokens = vLLM's block size, which vLLM enlarges for these models; the connector refuses others).
"""

from __future__ import annotations

import enum
from typing import Any

from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

from connector.vllm.hybrid import Group
from connector.vllm.window import GroupKind, GroupShape, group_layout
from kvstore.errors import ConfigError
from kvstore.layout import KVLayout

_WORKS = ("run this model without the kvstore connector (drop --kv-transfer-config), or with vLLM's own "
          "prefix cache only")

_STATE_KINDS = {"GDN_ATTN": "gated delta net", "MAMBA2": "Mamba2", "MAMBA1": "Mamba", "LINEAR": "linear attention",
                "SHORT_CONV": "short convolution"}


def group_shapes(config: KVCacheConfig, mamba_cache_mode: str) -> list[GroupShape]:
    """One `GroupShape` per vLLM KV cache group, in vLLM's group order; ConfigError for a group kvstore
    cannot store, naming the model's feature and the option that works."""
    return [_shape(group.kv_cache_spec, len(group.layer_names), mamba_cache_mode) for group in config.kv_cache_groups]


def hybrid_groups(config: KVCacheConfig | None, mamba_cache_mode: str, attention: KVLayout) -> list[Group] | None:
    """The groups the connector moves one by one, or None for a plain model (one full-attention or MLA group:
    the connector's single-layout path). Refuses, in one line, what it cannot store yet."""
    if config is None:
        return None
    if len(config.kv_cache_groups) == 1 and isinstance(config.kv_cache_groups[0].kv_cache_spec, MLAAttentionSpec):
        return None  # an MLA model: one latent group, the connector's single-layout path (connector/vllm/mla.py)
    shapes = group_shapes(config, mamba_cache_mode)
    if len(shapes) == 1 and shapes[0].kind is GroupKind.FULL:
        return None
    if len({s.block_size for s in shapes}) != 1:
        raise ConfigError(f"kvstore's vLLM connector needs one block size across KV cache groups, vLLM chose "
                          f"{sorted({s.block_size for s in shapes})}; set --block-size")
    _check_state_chunks(shapes, attention.chunk_tokens)
    return [Group(s, i, group_layout(s, attention)) for i, s in enumerate(shapes)]


def _check_state_chunks(shapes: list[GroupShape], chunk_tokens: int) -> None:
    """A state group needs a state at every chunk boundary: vLLM keeps one only where a prefill step stops,
    always at a block end, so a chunk must be exactly one block (module docstring)."""
    state = next((s for s in shapes if s.kind is GroupKind.STATE), None)
    if state is not None and chunk_tokens != state.block_size:
        raise ConfigError(f"kvstore keeps a Mamba / linear-attention layer's state at each chunk boundary, and vLLM "
                          f"keeps one only at the block end where a prefill step stops: set kv_connector_extra_config "
                          f"chunk_tokens to vLLM's block size for this model, {state.block_size} (now {chunk_tokens})")


def group_layer_names(config: KVCacheConfig) -> list[list[str]]:
    """Each group's layer names, in vLLM's group order."""
    return [list(group.layer_names) for group in config.kv_cache_groups]


def _shape(spec: KVCacheSpec, num_layers: int, mamba_cache_mode: str) -> GroupShape:
    # exact types: subclasses (chunked local, sink, MLA, cross attention) select blocks differently
    if type(spec) is SlidingWindowSpec:
        return GroupShape(GroupKind.SLIDING, spec.block_size, spec.page_size_bytes, num_layers,
                          window=spec.sliding_window)
    if type(spec) is FullAttentionSpec and spec.attention_chunk_size is None:  # a window here: vLLM's
        # conversion with its hybrid manager off, which keeps (and kvstore stores) the whole prefix
        return GroupShape(GroupKind.FULL, spec.block_size, spec.page_size_bytes, num_layers)
    if isinstance(spec, MambaSpec):
        return _state_shape(spec, num_layers, mamba_cache_mode)
    raise ConfigError(f"kvstore's vLLM connector cannot store a {_feature(spec)} KV cache group; {_WORKS}")


def _state_shape(spec: MambaSpec, num_layers: int, mamba_cache_mode: str) -> GroupShape:
    """A Mamba / linear-attention group: one state page per layer and boundary, its content bytes only (vLLM pads
    the page to the attention page; the padding is not stored)."""
    if mamba_cache_mode != "align":
        raise ConfigError(f"kvstore keeps a {_state_kind(spec)} layer's state at chunk boundaries, which needs "
                          f"vLLM to keep states at block ends: enable prefix caching (mamba_cache_mode "
                          f"'align', now {mamba_cache_mode!r}) or {_WORKS}")
    if spec.num_speculative_blocks:
        raise ConfigError(f"kvstore does not store a {_state_kind(spec)} layer's state under speculative decoding "
                          f"(vLLM moves its state blocks between steps); drop --speculative-config or {_WORKS}")
    page_bytes = spec.num_heads * spec.get_num_kernel_states(spec.block_size) * spec.state_content_size_bytes
    return GroupShape(GroupKind.STATE, spec.block_size, page_bytes, num_layers)


def _state_kind(spec: MambaSpec) -> str:
    name = spec.mamba_type.name if isinstance(spec.mamba_type, enum.Enum) else str(spec.mamba_type)
    return _STATE_KINDS.get(name, name)


def _feature(spec: Any) -> str:
    if isinstance(spec, MLAAttentionSpec):
        return "multi-head latent attention (MLA)"
    if isinstance(spec, FullAttentionSpec) and spec.attention_chunk_size is not None:
        return "chunked local attention"
    return type(spec).__name__
