"""What a model's KV costs to keep and to recompute: bytes per token and request, prefill FLOPs.

    stored bytes/token  = elements/token * codec bytes/element (+ int8 scales)
    prefill FLOPs(P->T) = 2 * active_params * (T - P)                      (the matmuls)
                        + layers * heads * (qk_dim + v_dim) * (T^2 - P^2)   (causal attention)

The attention term counts Q.K and A.V (2 FLOPs per multiply-add) over the (T^2 - P^2)/2 query/key
pairs a causal prefill of tokens P..T-1 touches when tokens 0..P-1 come from the cache.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, TypedDict

from kvstore.errors import ConfigError, UnknownNameError
from kvstore.layout import PRESETS, KVLayout
from kvstore.plan.inputs import ModelSpec

logger = logging.getLogger(__name__)

CODECS = ("none", "fp8", "int8")
INT8_SCALE_BYTES = 4  # one float32 scale per token, layer, plane and kv head (per-token quantization)

# Published parameter counts and attention widths of the layout presets (kvstore.layout.PRESETS).
class _PresetCosts(TypedDict):
    num_params: int
    num_attention_heads: int
    qk_head_dim: int
    v_head_dim: int


class PresetCosts(_PresetCosts, total=False):
    """A preset's ModelSpec fields beyond its layout (published counts)."""

    num_active_params: int
    weight_bytes_per_param: int


_PRESET_COSTS: dict[str, PresetCosts] = {
    "llama-3-8b": {"num_params": 8_030_261_248, "num_attention_heads": 32, "qk_head_dim": 128, "v_head_dim": 128},
    "llama-3-70b": {"num_params": 70_553_706_496, "num_attention_heads": 64, "qk_head_dim": 128, "v_head_dim": 128},
    "qwen2.5-7b": {"num_params": 7_615_616_512, "num_attention_heads": 28, "qk_head_dim": 128, "v_head_dim": 128},
    "mistral-7b": {"num_params": 7_241_732_096, "num_attention_heads": 32, "qk_head_dim": 128, "v_head_dim": 128},
    # 671B weights (fp8), 37B active per token; MLA queries are 128 + 64 wide, values 128.
    "deepseek-v3": {"num_params": 671_000_000_000, "num_active_params": 37_000_000_000, "num_attention_heads": 128,
                    "qk_head_dim": 192, "v_head_dim": 128, "weight_bytes_per_param": 1},
}


def kv_elements_per_token(layout: KVLayout) -> int:
    return layout.num_planes * layout.num_layers * layout.num_kv_heads * layout.head_dim


def stored_bytes_per_token(layout: KVLayout, codec: str = "none") -> int:
    """Bytes one token of KV takes in the store under `codec` (`none` keeps `layout.dtype`)."""
    if codec == "none":
        return layout.bytes_per_token
    if codec == "fp8":
        return kv_elements_per_token(layout)
    if codec == "int8":
        num_scales = layout.num_planes * layout.num_layers * layout.num_kv_heads
        return kv_elements_per_token(layout) + num_scales * INT8_SCALE_BYTES
    raise UnknownNameError(f"unknown codec {codec!r} for planning; valid: {', '.join(CODECS)}")


def bytes_per_token(model: ModelSpec) -> int:
    return stored_bytes_per_token(model.layout, model.codec)


def bytes_per_request(model: ModelSpec, prompt_tokens: float) -> float:
    return bytes_per_token(model) * prompt_tokens


def prefill_flops(model: ModelSpec, total_tokens: float, cached_tokens: float = 0.0) -> float:
    """FLOPs to prefill tokens `cached_tokens..total_tokens-1` when the first ones are loaded."""
    if not 0 <= cached_tokens <= total_tokens:
        raise ConfigError(f"cached_tokens must be in [0, total_tokens={total_tokens}], got {cached_tokens}")
    linear = 2.0 * model.num_active_params * (total_tokens - cached_tokens)
    attn_width = model.layout.num_layers * model.num_attention_heads * (model.qk_head_dim + model.v_head_dim)
    return linear + attn_width * (total_tokens**2 - cached_tokens**2)


def model_from_preset(name: str, *, kv_dtype: str = "bfloat16", codec: str = "none", chunk_tokens: int = 256) -> ModelSpec:
    key = name.lower()
    if key not in _PRESET_COSTS:
        raise UnknownNameError(f"unknown model {name!r}; valid presets: {', '.join(sorted(PRESETS))}, "
                               "or a path to a Hugging Face config.json")
    layout = KVLayout.from_preset(key, dtype=kv_dtype, chunk_tokens=chunk_tokens)
    costs = PresetCosts(**_PRESET_COSTS[key])
    costs.setdefault("num_active_params", costs["num_params"])
    stored_bytes_per_token(layout, codec)  # validates the codec name early
    return ModelSpec(name=key, layout=layout, codec=codec, **costs)


def model_from_hf_config(path: str | Path, *, kv_dtype: str | None = None, codec: str = "none",
                         chunk_tokens: int = 256) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (dense GQA, MoE, MLA); params are counted from it."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read Hugging Face config {path}: {exc}") from exc
    layout = KVLayout.from_hf_config(config, dtype=kv_dtype, chunk_tokens=chunk_tokens)
    total, active = count_params(config)
    heads = int(config["num_attention_heads"])
    if config.get("kv_lora_rank"):
        qk = int(config.get("qk_nope_head_dim", 128)) + int(config.get("qk_rope_head_dim", 64))
        v = int(config.get("v_head_dim", 128))
    else:
        qk = v = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    stored_bytes_per_token(layout, codec)
    return ModelSpec(name=Path(path).parent.name or Path(path).stem, layout=layout, num_params=total,
                     num_active_params=active, num_attention_heads=heads, qk_head_dim=qk, v_head_dim=v, codec=codec)


def count_params(config: dict[str, Any]) -> tuple[int, int]:
    """(total, active) parameters of a decoder-only config: embeddings, attention, MLP/MoE, norms."""
    try:
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        embed = int(config["vocab_size"]) * hidden * (1 if config.get("tie_word_embeddings") else 2)
        attn = _attention_params(config, hidden)
        dense_mlp = 3 * hidden * int(config["intermediate_size"])
    except KeyError as exc:
        raise ConfigError(f"Hugging Face config lacks {exc.args[0]!r}; cannot count parameters") from exc
    num_experts = int(config.get("n_routed_experts") or config.get("num_local_experts") or 0)
    if not num_experts:
        per_layer = attn + dense_mlp + 2 * hidden
        total = embed + layers * per_layer + hidden
        return total, total
    expert = 3 * hidden * int(config.get("moe_intermediate_size") or config["intermediate_size"])
    shared = int(config.get("n_shared_experts") or 0) * expert
    top_k = int(config.get("num_experts_per_tok") or 1)
    dense_layers = int(config.get("first_k_dense_replace") or 0)
    moe_layers = layers - dense_layers
    router = hidden * num_experts
    base = embed + layers * (attn + 2 * hidden) + hidden + dense_layers * dense_mlp + moe_layers * (shared + router)
    return base + moe_layers * num_experts * expert, base + moe_layers * top_k * expert


def _attention_params(config: dict[str, Any], hidden: int) -> int:
    heads = int(config["num_attention_heads"])
    if config.get("kv_lora_rank"):
        rope, nope = int(config.get("qk_rope_head_dim", 64)), int(config.get("qk_nope_head_dim", 128))
        v_dim, kv_rank = int(config.get("v_head_dim", 128)), int(config["kv_lora_rank"])
        q_rank = int(config.get("q_lora_rank") or 0)
        q_proj = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        kv_proj = hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim)
        return q_proj + kv_proj + heads * v_dim * hidden
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    return 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim


def load_model(name_or_path: str, *, kv_dtype: str = "bfloat16", codec: str = "none", chunk_tokens: int = 256) -> ModelSpec:
    """`--model`: a preset name, a config.json path, or a directory holding one."""
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        return model_from_hf_config(path, kv_dtype=kv_dtype, codec=codec, chunk_tokens=chunk_tokens)
    return model_from_preset(name_or_path, kv_dtype=kv_dtype, codec=codec, chunk_tokens=chunk_tokens)
