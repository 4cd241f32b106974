"""vLLM's KV cache groups (its KVCacheConfig) as kvstore group shapes; what kvstore cannot store is refused in one line."""

from __future__ import annotations

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
    if any(isinstance(group.kv_cache_spec, MambaSpec) for group in config.kv_cache_groups):
        raise ConfigError("kvstore's vLLM connector does not store Mamba / linear-attention (gated delta net) "
                          f"state yet; {_WORKS}")
    shapes = group_shapes(config, mamba_cache_mode)
    if len(shapes) == 1 and shapes[0].kind is GroupKind.FULL:
        return None
    if len({s.block_size for s in shapes}) != 1:
        raise ConfigError(f"kvstore's vLLM connector needs one block size across KV cache groups, vLLM chose "
                          f"{sorted({s.block_size for s in shapes})}; set --block-size")
    return [Group(s, i, group_layout(s, attention)) for i, s in enumerate(shapes)]


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
        if mamba_cache_mode != "align":
            raise ConfigError(f"kvstore keeps a {spec.mamba_type} layer's state at chunk boundaries, which needs "
                              f"vLLM to keep states at block ends: enable prefix caching (mamba_cache_mode "
                              f"'align', now {mamba_cache_mode!r}) or {_WORKS}")
        return GroupShape(GroupKind.STATE, spec.block_size, spec.page_size_bytes, num_layers)
    raise ConfigError(f"kvstore's vLLM connector cannot store a {_feature(spec)} KV cache group; {_WORKS}")


def _feature(spec: Any) -> str:
    if isinstance(spec, MLAAttentionSpec):
        return "multi-head latent attention (MLA)"
    if isinstance(spec, FullAttentionSpec) and spec.attention_chunk_size is not None:
        return "chunked local attention"
    return type(spec).__name__
