"""A Llama-style decoder (RMSNorm, RoPE, GQA, SwiGLU) with paged attention in torch; parameter names
match Hugging Face's LlamaForCausalLM so its state dict loads as is."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from connector.engine.attention import AttentionBatch, paged_attention
from kvstore.errors import ConfigError
from kvstore.kv_scope import ModelIdentity
from kvstore.layout import KVLayout


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Model geometry; `to_hf_dict()` gives the matching transformers LlamaConfig kwargs."""

    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"RoPE needs an even head_dim, got {self.head_dim}")

    @property
    def num_parameters(self) -> int:
        """Weights of the model built from this config (embedding, layers, final norm, untied LM head)."""
        h, d = self.hidden_size, self.head_dim
        attention = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        layer = attention + 3 * h * self.intermediate_size + 2 * h
        return 2 * self.vocab_size * h + self.num_layers * layer + h

    @property
    def weight_bytes(self) -> int:
        return self.num_parameters * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()

    def identity(self, layout: KVLayout) -> ModelIdentity:
        """What this model's KV is valid for: its geometry and seed name the weights (kvstore.kv_scope)."""
        weights = (f"kvstore-engine/L{self.num_layers}-H{self.hidden_size}-I{self.intermediate_size}-A{self.num_heads}"
                   f"-KV{self.num_kv_heads}-D{self.head_dim}-V{self.vocab_size}-seed{self.seed}")
        return ModelIdentity(model=weights, kv_dtype=layout.dtype, layout_fingerprint=layout.fingerprint, engine="own")

    def kv_layout(self, chunk_tokens: int) -> KVLayout:
        return KVLayout(num_layers=self.num_layers, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                        dtype=self.dtype, chunk_tokens=chunk_tokens)

    def to_hf_dict(self) -> dict[str, object]:
        return dict(vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                    num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
                    num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim, rope_theta=self.rope_theta,
                    rms_norm_eps=self.rms_norm_eps, tie_word_embeddings=False, attention_bias=False,
                    mlp_bias=False, max_position_embeddings=1 << 16)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_tables(positions: torch.Tensor, dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 1, dim] of Llama's rotate-half RoPE at `positions` [T]: the same for every layer of a step."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).float() / dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos()[:, None, :].to(dtype), emb.sin()[:, None, :].to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE as in Llama: x [T, heads, dim] with tables from `rope_tables`."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)

    def forward(self, x: torch.Tensor, batch: AttentionBatch, kv_cache: torch.Tensor) -> torch.Tensor:
        """x [T, hidden]; kv_cache [2, num_blocks, page, kv_heads, dim] of this layer (written in place)."""
        cfg, t = self.cfg, x.shape[0]
        if batch.rope is None:
            batch.rope = rope_tables(batch.positions, cfg.head_dim, cfg.rope_theta, x.dtype)
        cos, sin = batch.rope
        q = rope(self.q_proj(x).view(t, cfg.num_heads, cfg.head_dim), cos, sin)
        k = rope(self.k_proj(x).view(t, cfg.num_kv_heads, cfg.head_dim), cos, sin)
        v = self.v_proj(x).view(t, cfg.num_kv_heads, cfg.head_dim)
        flat = kv_cache.view(2, -1, cfg.num_kv_heads, cfg.head_dim)
        flat[0].index_copy_(0, batch.slot_ids, k)
        flat[1].index_copy_(0, batch.slot_ids, v)
        out = paged_attention(q, kv_cache, batch, cfg.num_heads // cfg.num_kv_heads)
        return self.o_proj(out.reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, batch: AttentionBatch, kv_cache: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), batch, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBackbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaModel(nn.Module):
    """Forward over a flattened varlen batch; KV goes to the paged cache [layers, 2, blocks, page, kv_heads, dim]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = LlamaBackbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._init_weights(cfg.seed)
        self.to(getattr(torch, cfg.dtype))

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1] if p.dim() > 1 and "embed" not in name else 1))

    @torch.no_grad()
    def forward(self, token_ids: torch.Tensor, batch: AttentionBatch, kv_cache: torch.Tensor,
                logit_indices: torch.Tensor) -> torch.Tensor:
        """Logits [len(logit_indices), vocab] at the given flat token indices."""
        x = self.model.embed_tokens(token_ids)
        for layer, layer_cache in zip(self.model.layers, kv_cache, strict=True):
            x = layer(x, batch, layer_cache)
        x = self.model.norm(x[logit_indices])
        return self.lm_head(x).float()
