"""A tiny Qwen3-Next-shaped hybrid for the integration tests: `tiny_qwen3_next(path)` writes its config.json and
seeded bf16 weights.

Gated delta net layers (one key and one value head of 128, the width vLLM's CPU kernel runs) alternate with full
attention layers (4 KV heads of 128), a small MoE (4 experts, 2 per token; vLLM's Qwen3-Next wants one), vocabulary 1024, bf16. Weights come
from transformers' Qwen3NextForCausalLM at initializer_range 0.2 from `seed`, with each delta net layer's decay
kept slow (A in [0.01, 0.1]) so that the state at a chunk boundary still steers the answer tokens later: a state
loaded wrong or not at all changes the answer.

One layer's state is a 3 x 384 bf16 convolution state and a 128 x 128 SSM state (float32 where vLLM's CPU kernel
keeps it so), at most 67,840 bytes; a full-attention token is 2,048 bytes per layer, so a 64-token block holds it
and vLLM keeps `--block-size 64` for both groups.
"""

from __future__ import annotations

import json
from pathlib import Path

NUM_LAYERS, KV_HEADS, HEAD_DIM, BLOCK = 4, 4, 128, 64
LAYER_TYPES = ["linear_attention", "full_attention"] * (NUM_LAYERS // 2)


def tiny_qwen3_next(path: Path, *, seed: int = 0) -> Path:
    """The model's directory (config.json + model.safetensors, bf16)."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    config = Qwen3NextConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=NUM_LAYERS,
                             num_attention_heads=8, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                             linear_num_key_heads=1, linear_num_value_heads=1, linear_key_head_dim=128,
                             linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128,
                             max_position_embeddings=4096,
                             layer_types=LAYER_TYPES, initializer_range=0.2, tie_word_embeddings=False,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith("A_log"):  # slow decay: the state carries the prefix into the answer
                weight.copy_(torch.empty_like(weight).uniform_(0.01, 0.1).log_())
    model.bfloat16().save_pretrained(path, safe_serialization=True)
    written = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**written, "architectures": ["Qwen3NextForCausalLM"],
                                                  "torch_dtype": "bfloat16", "dtype": "bfloat16"}))
    return path
