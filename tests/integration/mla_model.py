"""A tiny DeepSeek-V2-shaped MLA model for the integration tests: `tiny_deepseek_v2(path)` writes its config.json
and seeded bf16 weights, and `mla_layout` is the layout kvstore stores it in.

vLLM's CPU MLA backend (CPU_MLA) runs only DeepSeek's latent width, kv_lora_rank 512 + rope 64, and block size 16
(vLLM forces it); the rest is small: 2 layers, 16 heads of 128 + 64 query dims, dense MLPs (first_k_dense_replace
covers every layer, so no MoE), vocabulary 1024. Weights come from transformers' DeepseekV2ForCausalLM at
initializer_range 0.2 from `seed`, so the answer depends on the KV of the prefix.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvstore.layout import AttentionKind, KVLayout

NUM_LAYERS, KV_LORA_RANK, ROPE_DIM = 2, 512, 64


def tiny_deepseek_v2(path: Path, *, seed: int = 0) -> Path:
    """The model's directory (config.json + model.safetensors, bf16)."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 512,
              "intermediate_size": 512, "num_hidden_layers": NUM_LAYERS, "num_attention_heads": 16,
              "num_key_value_heads": 16, "kv_lora_rank": KV_LORA_RANK, "q_lora_rank": None,
              "qk_rope_head_dim": ROPE_DIM, "qk_nope_head_dim": 128, "v_head_dim": 128,
              "first_k_dense_replace": NUM_LAYERS, "n_routed_experts": 4, "num_experts_per_tok": 2,
              "moe_intermediate_size": 64, "n_shared_experts": 1, "vocab_size": 1024, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}
    torch.manual_seed(seed)
    model = DeepseekV2ForCausalLM(DeepseekV2Config(**{**config, "initializer_range": 0.2}))  # type: ignore[arg-type]
    model.bfloat16().save_pretrained(path, safe_serialization=True)
    written = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**written, **config}))  # vLLM reads rope_theta and torch_dtype
    return path


def mla_layout(chunk_tokens: int) -> KVLayout:
    """How kvstore stores the model: one latent of 512 + 64 bf16 values per token and layer."""
    return KVLayout(num_layers=NUM_LAYERS, num_kv_heads=1, head_dim=KV_LORA_RANK + ROPE_DIM, dtype="bfloat16",
                    chunk_tokens=chunk_tokens, kind=AttentionKind.MLA)
