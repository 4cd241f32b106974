"""`KVLayout`: the shape of one model's KV cache, its sizes, fingerprint and presets.

Canonical chunk shape, contiguous::

    MHA/GQA: [num_layers, 2, chunk_tokens, num_kv_heads, head_dim]   (K plane, V plane)
    MLA:     [num_layers, 1, chunk_tokens, 1,            latent_dim]   (one latent per token)
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import xxhash

from kvstore.errors import ConfigError, UnknownNameError

if TYPE_CHECKING:
    import torch

DTYPE_ITEMSIZE = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}


class AttentionKind(enum.Enum):
    """How a layer stores KV: K and V per kv-head (MHA/GQA/MQA) or one compressed latent (MLA)."""

    MHA = "mha"
    MLA = "mla"


@dataclass(frozen=True, slots=True, kw_only=True)
class KVLayout:
    """The KV cache geometry of one model, as kvstore stores it.

    For MLA, `num_kv_heads` is 1 and `head_dim` is the latent width (kv_lora_rank + rope dim).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    chunk_tokens: int = 256
    kind: AttentionKind = AttentionKind.MHA

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "chunk_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"KVLayout.{name} must be a positive int, got {value!r}")
        if self.dtype not in DTYPE_ITEMSIZE:
            raise ConfigError(
                f"KVLayout.dtype {self.dtype!r} is not supported; use one of {sorted(DTYPE_ITEMSIZE)}"
            )
        if not isinstance(self.kind, AttentionKind):
            raise ConfigError(f"KVLayout.kind must be an AttentionKind, got {self.kind!r}")
        if self.kind is AttentionKind.MLA and self.num_kv_heads != 1:
            raise ConfigError(f"an MLA layout has one latent per token: num_kv_heads must be 1, got {self.num_kv_heads}")

    @property
    def itemsize(self) -> int:
        return DTYPE_ITEMSIZE[self.dtype]

    @property
    def num_planes(self) -> int:
        """2 for K and V, 1 for an MLA latent."""
        return 1 if self.kind is AttentionKind.MLA else 2

    @property
    def bytes_per_token(self) -> int:
        return self.num_planes * self.num_layers * self.num_kv_heads * self.head_dim * self.itemsize

    @property
    def chunk_bytes(self) -> int:
        return self.bytes_per_token * self.chunk_tokens

    @property
    def chunk_shape(self) -> tuple[int, int, int, int, int]:
        return (self.num_layers, self.num_planes, self.chunk_tokens, self.num_kv_heads, self.head_dim)

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)  # type: ignore[no-any-return]

    @property
    def fingerprint(self) -> int:
        """A stable 64-bit id of this geometry (same on every machine and Python version)."""
        text = f"kvlayout/1|{self.kind.value}|{self.num_layers}|{self.num_kv_heads}|{self.head_dim}|{self.dtype}|{self.chunk_tokens}"
        return xxhash.xxh3_64_intdigest(text.encode())

    def with_chunk_tokens(self, chunk_tokens: int) -> KVLayout:
        return replace(self, chunk_tokens=chunk_tokens)

    def with_dtype(self, dtype: str) -> KVLayout:
        return replace(self, dtype=dtype)

    def to_dict(self) -> dict[str, int | str]:
        data = asdict(self)
        data["kind"] = self.kind.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KVLayout:
        data = dict(data)
        data["kind"] = AttentionKind(data.get("kind", "mha"))
        return cls(**data)

    @classmethod
    def from_preset(cls, name: str, *, dtype: str = "bfloat16", chunk_tokens: int = 256) -> KVLayout:
        """A named model's layout; raises UnknownNameError listing the presets."""
        try:
            fields = PRESETS[name.lower()]
        except KeyError:
            raise UnknownNameError(f"unknown model preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}") from None
        return cls(**fields, dtype=dtype, chunk_tokens=chunk_tokens)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any] | str | Path, *, dtype: str | None = None, chunk_tokens: int = 256) -> KVLayout:
        """Build from a Hugging Face `config.json` (a path or the parsed dict), GQA or MLA."""
        if not isinstance(config, dict):
            try:
                config = json.loads(Path(config).read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ConfigError(f"cannot read Hugging Face config {config}: {exc}") from exc
        assert isinstance(config, dict)
        dtype = dtype or _hf_dtype(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        try:
            num_layers = int(config["num_hidden_layers"])
            if "kv_lora_rank" in config and config.get("kv_lora_rank"):
                latent = int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim", 0))
                return cls(num_layers=num_layers, num_kv_heads=1, head_dim=latent, dtype=dtype,
                           chunk_tokens=chunk_tokens, kind=AttentionKind.MLA)
            num_heads = int(config["num_attention_heads"])
            num_kv_heads = int(config.get("num_key_value_heads") or num_heads)
            head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // num_heads)
        except KeyError as exc:
            raise ConfigError(f"Hugging Face config lacks {exc.args[0]!r}; is it a decoder-only LM config?") from exc
        return cls(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                   chunk_tokens=chunk_tokens)


def _hf_dtype(name: str) -> str:
    name = str(name).removeprefix("torch.")
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32", "fp32": "float32"}
    name = aliases.get(name, name)
    if name not in DTYPE_ITEMSIZE:
        raise ConfigError(f"Hugging Face dtype {name!r} is not supported; pass dtype= explicitly")
    return name


# Geometry from each model's published config.json.
class _PresetGeometry(TypedDict):
    num_layers: int
    num_kv_heads: int
    head_dim: int


class PresetGeometry(_PresetGeometry, total=False):
    """A preset's fields of KVLayout (the rest come from the caller: dtype, chunk_tokens)."""

    kind: AttentionKind


PRESETS: dict[str, PresetGeometry] = {
    "llama-3-8b": {"num_layers": 32, "num_kv_heads": 8, "head_dim": 128},
    "llama-3-70b": {"num_layers": 80, "num_kv_heads": 8, "head_dim": 128},
    "qwen2.5-7b": {"num_layers": 28, "num_kv_heads": 4, "head_dim": 128},
    "mistral-7b": {"num_layers": 32, "num_kv_heads": 8, "head_dim": 128},
    # DeepSeek-V3: kv_lora_rank 512 + qk_rope_head_dim 64, one latent per token and layer.
    "deepseek-v3": {"num_layers": 61, "num_kv_heads": 1, "head_dim": 576, "kind": AttentionKind.MLA},
}
