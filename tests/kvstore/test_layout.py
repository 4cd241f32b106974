"""KVLayout sizes, presets, fingerprints and Hugging Face config parsing."""

import json
from pathlib import Path
from typing import Any

import pytest

from kvstore.errors import ConfigError, UnknownNameError
from kvstore.layout import AttentionKind, KVLayout


@pytest.mark.parametrize(
    ("preset", "bytes_per_token"),
    [("llama-3-8b", 131_072), ("llama-3-70b", 327_680), ("mistral-7b", 131_072), ("qwen2.5-7b", 57_344),
     ("deepseek-v3", 70_272)],
)
def test_preset_bytes_per_token(preset: Any, bytes_per_token: Any) -> None:
    assert KVLayout.from_preset(preset).bytes_per_token == bytes_per_token


def test_chunk_bytes_and_shape() -> None:
    layout = KVLayout.from_preset("llama-3-8b")
    assert layout.chunk_bytes == 32 * 2**20  # 256 tokens x 128 KiB
    assert layout.chunk_shape == (32, 2, 256, 8, 128)
    assert KVLayout.from_preset("deepseek-v3").chunk_shape == (61, 1, 256, 1, 576)


def test_128k_prompt_is_16_gib() -> None:
    assert KVLayout.from_preset("llama-3-8b").bytes_per_token * 128 * 1024 == 16 * 2**30


def test_fp8_halves_bf16() -> None:
    bf16 = KVLayout.from_preset("llama-3-70b")
    assert bf16.with_dtype("float8_e4m3fn").bytes_per_token * 2 == bf16.bytes_per_token


def test_fingerprint_is_stable_and_distinguishes() -> None:
    a = KVLayout.from_preset("llama-3-8b")
    # Same value on every machine and process: a literal, computed once.
    assert a.fingerprint == KVLayout.from_preset("llama-3-8b").fingerprint == 0xCB288BB03DC0BB43
    assert a.fingerprint != a.with_chunk_tokens(128).fingerprint
    assert a.fingerprint != a.with_dtype("float16").fingerprint


def test_unknown_preset_lists_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match="llama-3-8b"):
        KVLayout.from_preset("gpt-9")


def test_bad_fields_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="num_layers"):
        KVLayout(num_layers=0, num_kv_heads=8, head_dim=128)
    with pytest.raises(ConfigError, match="dtype"):
        KVLayout(num_layers=1, num_kv_heads=8, head_dim=128, dtype="float64")
    with pytest.raises(ConfigError, match="MLA"):
        KVLayout(num_layers=1, num_kv_heads=8, head_dim=128, kind=AttentionKind.MLA)


def test_from_hf_config_gqa(tmp_path: Path) -> None:
    config = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096, "torch_dtype": "bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert KVLayout.from_hf_config(path) == KVLayout.from_preset("llama-3-8b")


def test_from_hf_config_mla() -> None:
    config = {"num_hidden_layers": 61, "num_attention_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
              "hidden_size": 7168, "torch_dtype": "bfloat16"}
    layout = KVLayout.from_hf_config(config)
    assert layout.kind is AttentionKind.MLA and layout.bytes_per_token == 70_272


def test_from_hf_config_missing_field() -> None:
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        KVLayout.from_hf_config({"hidden_size": 8})


def test_dict_round_trip() -> None:
    layout = KVLayout.from_preset("deepseek-v3", chunk_tokens=64)
    assert KVLayout.from_dict(layout.to_dict()) == layout
