"""KV chunks produced by the engine's own model (connector/engine): a prefill writes them into its paged cache.

The model has random weights (no download), the geometry of the layout (layers, KV heads, head
dim, dtype) and a Llama block (RMSNorm, RoPE, GQA, SwiGLU), so keys carry RoPE's rotation and
values the projections' statistics; the chunk is what the connector would hand to the store.
"""

from __future__ import annotations

import functools

import torch

from connector.engine.model import ModelConfig
from connector.engine.model_runner import ModelRunner, StepInput
from connector.engine.sequence import Sequence
from kvstore.layout import KVLayout


def model_config(layout: KVLayout, *, seed: int = 0) -> ModelConfig:
    """A small Llama of the layout's KV geometry (hidden size = KV width, 2 query heads per KV head)."""
    hidden = layout.num_kv_heads * layout.head_dim
    return ModelConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_layers=layout.num_layers, num_heads=2 * layout.num_kv_heads, num_kv_heads=layout.num_kv_heads,
                       head_dim=layout.head_dim, rope_theta=500000.0, dtype=str(layout.torch_dtype).removeprefix("torch."),
                       seed=seed)


@functools.lru_cache(maxsize=4)
def model_chunk(layout: KVLayout, *, seed: int = 0) -> torch.Tensor:
    """One chunk (layout.chunk_shape, layout dtype): the KV of a prefill of `chunk_tokens` prompt tokens."""
    runner = ModelRunner(model_config(layout, seed=seed), num_blocks=1, page_size=layout.chunk_tokens)
    prompt = torch.randint(0, 1024, (layout.chunk_tokens,), generator=torch.Generator().manual_seed(seed)).tolist()
    seq = Sequence(prompt, page_size=layout.chunk_tokens)
    seq.block_ids = [0]
    runner.execute([StepInput(seq=seq, start=0, num_tokens=layout.chunk_tokens)])
    return runner.kv_cache[:, :, 0].contiguous()  # [layers, 2, tokens, kv_heads, dim] = chunk_shape
