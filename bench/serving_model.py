"""The dummy-weight Llama `kvstore bench serving` serves, with a word-level tokenizer so `vllm bench serve` runs.

The model is `kvstore bench vllm`'s (4 layers, 8 heads, 4 KV heads, head_dim 64, hidden 512: 8 KiB of
float32 KV per token), big enough that prefill dominates TTFT on a CPU: on the shared 2-core machine vLLM
prefills it at ~200-400 tokens/s, so a serving prompt of ~800 tokens costs 2-4 s where a decode step costs
~0.1-0.3 s, and in `kvstore bench serving` vLLM alone spends 86-88% of its TTFT queued behind other requests'
prefills. A larger model would lengthen every run without changing what dominates. The tokenizer is built here, not
downloaded: token id i is the word "t<i>", so any id sequence decodes to text that encodes back to it.
"""

from __future__ import annotations

import json
from pathlib import Path

MODEL = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64}
VOCAB_SIZE = 1024
SPECIAL = {"<unk>": 0, "<s>": 1, "</s>": 2}


def kv_bytes_per_token(dtype_bytes: int = 4) -> int:
    return 2 * MODEL["num_hidden_layers"] * MODEL["num_key_value_heads"] * MODEL["head_dim"] * dtype_bytes


def write_model(path: Path) -> Path:
    """config.json (weights: vLLM's --load-format dummy) and a tokenizer in `path`."""
    heads, dim = MODEL["num_attention_heads"], MODEL["head_dim"]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": heads * dim,
              "intermediate_size": 4 * heads * dim, "vocab_size": VOCAB_SIZE, "max_position_embeddings": 8192,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32", "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", **MODEL}
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
