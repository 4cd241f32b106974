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

from connector.vllm.window import GroupKind, GroupShape
from kvstore.errors import ConfigError

_WORKS = ("run this model without the kvstore connector (drop --kv-transfer-config), or with vLLM's own "
          "prefix cache only")


def group_shapes(config: KVCacheConfig, mamba_cache_mode: str) -> list[GroupShape]:
    """One `GroupShape` per vLLM KV cache group, in vLLM's group order; ConfigError for a group kvstore
    cannot store, naming the model's feature and the option that works."""
    return [_shape(group.kv_cache_spec, len(group.layer_names), mamba_cache_mode) for group in config.kv_cache_groups]


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
