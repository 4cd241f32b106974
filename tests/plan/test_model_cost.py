"""KV bytes and prefill FLOPs: the issue's exact known answers, HF configs, and a hand-sized model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstore.errors import UnknownNameError
from kvstore.plan.inputs import ModelSpec
from kvstore.plan.model_cost import (
    bytes_per_request,
    bytes_per_token,
    count_params,
    load_model,
    model_from_preset,
    prefill_flops,
    stored_bytes_per_token,
)

LLAMA_3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V3_ATTENTION = {
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "vocab_size": 129280, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(("name", "expected"), [("llama-3-8b", 131_072), ("llama-3-70b", 327_680), ("deepseek-v3", 70_272)])
def test_known_bytes_per_token_in_bf16(name: str, expected: int) -> None:
    assert bytes_per_token(model_from_preset(name)) == expected


def test_128k_token_llama_3_8b_prompt_is_16_gib() -> None:
    assert bytes_per_request(model_from_preset("llama-3-8b"), 128 * 1024) == 16 * 2**30


@pytest.mark.parametrize("name", ["llama-3-8b", "llama-3-70b", "deepseek-v3"])
def test_fp8_halves_and_int8_halves_plus_one_fp32_scale_per_token_layer_plane_head(name: str) -> None:
    layout = model_from_preset(name).layout
    bf16 = stored_bytes_per_token(layout, "none")
    assert stored_bytes_per_token(layout, "fp8") == bf16 // 2
    scales = layout.num_planes * layout.num_layers * layout.num_kv_heads * 4
    assert stored_bytes_per_token(layout, "int8") == bf16 // 2 + scales
    assert bytes_per_token(model_from_preset(name, kv_dtype="float8_e4m3fn")) == bf16 // 2


def test_llama_3_8b_int8_is_67584_bytes() -> None:
    # 65,536 B of int8 values + 2 planes x 32 layers x 8 heads x 4 B of scales = 2,048 B.
    assert bytes_per_token(model_from_preset("llama-3-8b", codec="int8")) == 67_584


def test_hf_config_gives_the_preset_answers(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_8B_CONFIG))
    model = load_model(str(tmp_path))  # a directory holding config.json
    assert bytes_per_token(model) == 131_072
    assert model.num_params == 8_030_261_248  # the published count
    (tmp_path / "ds.json").write_text(json.dumps(DEEPSEEK_V3_ATTENTION))
    deepseek = load_model(str(tmp_path / "ds.json"))
    assert bytes_per_token(deepseek) == 70_272
    assert (deepseek.qk_head_dim, deepseek.v_head_dim) == (192, 128)


def test_moe_counts_active_experts_only() -> None:
    total, active = count_params(DEEPSEEK_V3_ATTENTION)
    # DeepSeek-V3 publishes 671B total (with a 14B MTP module not counted here) and 37B active.
    assert 650e9 < total < 680e9
    assert 36e9 < active < 39e9


def test_prefill_flops_by_hand(tiny_model: ModelSpec) -> None:
    # 2 N T + A T^2 with N = 1e6, A = 128: T = 10 -> 20,000,000 + 12,800.
    assert prefill_flops(tiny_model, 10) == 2 * 1_000_000 * 10 + 128 * 100
    # 4 tokens cached: 2 N (10 - 4) + A (100 - 16).
    assert prefill_flops(tiny_model, 10, 4) == 2 * 1_000_000 * 6 + 128 * 84


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match="llama-3-70b"):
        model_from_preset("gpt-5")
    with pytest.raises(UnknownNameError, match="fp8"):
        model_from_preset("llama-3-8b", codec="zstd")
