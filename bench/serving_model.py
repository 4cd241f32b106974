"""The dummy-weight Llamas `kvstore bench serving` serves, with a word-level tokenizer so `vllm bench serve` runs.

SMALL is `kvstore bench vllm`'s model (4 layers, 8 heads, 4 KV heads, head_dim 64, hidden 512, float32: 8 KiB of
KV per token, ~3.9k FLOP of prefill per KV byte); the other benches and `kvstore bench serving --quick` use it.
LLAMA_1B has Llama-3.2-1B's shape (16 layers, hidden 2048, intermediate 8192, 32 heads, 8 KV heads, head_dim 64,
bfloat16: 32 KiB of KV per token, ~59k FLOP per KV byte, 15x SMALL's), so prefill dominates TTFT as it does with
real models; its vocabulary is ours (1,024 words), which leaves the per-token compute of the layers unchanged
(vLLM computes logits only for the last prompt token). The full `kvstore bench serving` serves it. The tokenizer
is built here, not downloaded: token id i is the word "t<i>", so any id sequence decodes to text that encodes back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

VOCAB_SIZE = 1024
SPECIAL = {"<unk>": 0, "<s>": 1, "</s>": 2}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """A Llama's sizes and the dtype vLLM runs it (and kvstore stores its KV) in."""

    name: str
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    dtype: str

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    @property
    def prefill_flops_per_kv_byte(self) -> float:
        """Matmul FLOPs per prompt token (2 per weight: q, k, v, o and the gated MLP) per byte of KV it leaves."""
        attention = self.hidden_size * self.head_dim * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        return 2 * self.num_hidden_layers * (attention + mlp) / self.kv_bytes_per_token


SMALL = ModelShape(name="small", num_hidden_layers=4, hidden_size=512, intermediate_size=2048, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=64, dtype="float32")
LLAMA_1B = ModelShape(name="llama-3.2-1b-shape", num_hidden_layers=16, hidden_size=2048, intermediate_size=8192,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, dtype="bfloat16")
MODEL = {"num_hidden_layers": SMALL.num_hidden_layers, "num_attention_heads": SMALL.num_attention_heads,
         "num_key_value_heads": SMALL.num_key_value_heads, "head_dim": SMALL.head_dim}  # SMALL, for the other benches


def kv_bytes_per_token(dtype_bytes: int = 4) -> int:
    """SMALL's KV bytes per token at `dtype_bytes` per value."""
    return SMALL.kv_bytes_per_token // DTYPE_BYTES[SMALL.dtype] * dtype_bytes


def write_model(path: Path, shape: ModelShape = SMALL) -> Path:
    """config.json (weights: vLLM's --load-format dummy) and a tokenizer in `path`."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": shape.hidden_size,
              "intermediate_size": shape.intermediate_size, "vocab_size": VOCAB_SIZE, "max_position_embeddings": 8192,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": shape.dtype, "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "num_hidden_layers": shape.num_hidden_layers,
              "num_attention_heads": shape.num_attention_heads, "num_key_value_heads": shape.num_key_value_heads,
              "head_dim": shape.head_dim}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    write_word_tokenizer(path)
    return path


def write_word_tokenizer(path: Path) -> None:
    """tokenizer.json (a WordLevel vocabulary "t3".."t1023" split on whitespace) and tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {**SPECIAL, **{f"t{i}": i for i in range(len(SPECIAL), VOCAB_SIZE)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with one space
    tokenizer.add_special_tokens(list(SPECIAL))
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 8192, "add_bos_token": False}))
