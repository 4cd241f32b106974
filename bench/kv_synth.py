"""Realistic synthetic KV chunks for codec benchmarks and error-bound tests (no model download).

Why these statistics (KIVI, KVQuant, and what a Llama-3 prefill shows):
* Keys have fixed outlier channels: a few of the head_dim channels are 5-20x larger than the
  rest in every token, and channels carry a per-channel bias. RoPE then rotates channel pairs
  (i, i + head_dim/2) by position-dependent angles, so the outliers smear across each pair but
  stay channel-localised. Per-token-per-head scaling must cope with that.
* Values have no channel outliers; their magnitude varies per token (heavy-tailed token norms).
* Everything is cast to the layout dtype (bf16 by default), whose low mantissa byte is noise
  and whose high byte is repetitive: that is what the lz4 byte-plane shuffle exploits.
"""

from __future__ import annotations

import torch

from kvstore.layout import KVLayout


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 500000.0) -> torch.Tensor:
    """Rotate [..., tokens, heads, head_dim] by RoPE at `positions` (Llama-3's half-split form)."""
    half = x.shape[-1] // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = positions.float()[:, None] * inv_freq[None, :]  # [tokens, half]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def synthetic_chunk(layout: KVLayout, *, seed: int = 0, start_token: int = 0) -> torch.Tensor:
    """One chunk of layout.chunk_shape and dtype with key outlier channels + RoPE, token-scaled values."""
    gen = torch.Generator().manual_seed(seed)
    num_layers, planes, tokens, heads, dim = layout.chunk_shape
    positions = torch.arange(start_token, start_token + tokens)
    out = torch.empty(layout.chunk_shape, dtype=torch.float32)
    for layer in range(num_layers):
        channel_scale = torch.exp(0.5 * torch.randn(heads, dim, generator=gen))
        outliers = torch.randint(0, dim, (heads, 4), generator=gen)
        channel_scale.scatter_(1, outliers, 5.0 + 15.0 * torch.rand(heads, 4, generator=gen))
        bias = 0.5 * torch.randn(heads, dim, generator=gen)
        keys = (bias + torch.randn(tokens, heads, dim, generator=gen)) * channel_scale
        out[layer, 0] = rope(keys, positions)
        if planes > 1:
            token_scale = torch.exp(0.7 * torch.randn(tokens, 1, 1, generator=gen))
            out[layer, 1] = 0.3 * token_scale * torch.randn(tokens, heads, dim, generator=gen)
    return out.to(layout.torch_dtype)
