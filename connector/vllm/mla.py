"""Which of vLLM's MLA caches the connector stores, decided at start (pure Python, no vllm import).

kvstore stores an MLA model's KV as one latent per token and layer, [kv_lora_rank | rope dims] in the model's
dtype (kvstore.layout, AttentionKind.MLA), the same bytes on every tensor-parallel rank. A setting that packs
or splits that latent is refused here, in one line naming the feature and the setting that works, before any
cache is allocated: a packed KV cache dtype (fp8 latents with their scales, fp8_ds_mla, per-token-head
scales), decode or prefill context parallelism (each rank then holds some of the tokens), and DeepSeek's
sparse attention (an indexer cache beside the latent, and DeepSeek-V4's compressed states).

One vLLM 0.32 CPU defect is only warned about (it is vLLM's with or without the connector): its CPU
`rotary_embedding` kernel ignores the token stride of MLA's k_pe (a view into the kv_a projection's
output, stride kv_lora_rank + rope dims): measured, a 100-token prefill had 11 rows of k_pe rotated, the
rest of the rotation landing elsewhere in that buffer. What a token attends to then depends on how its
prompt was split into steps, and a hit (which computes only the prompt's tail) answers unlike a full prefill. vLLM's torch rope is right:
compilation_config custom_ops ["all", "-rotary_embedding"] (found by the MLA integration test).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvstore.errors import ConfigError

_SPARSE_MARKERS = ("index_topk",)  # DeepSeek sparse attention (V3.2, V4): an indexer cache per layer
_SPARSE_MODEL_TYPES = ("deepseek_v32", "deepseek_v4")


def check_mla(*, model: str, cache_dtype: str, dcp_size: int, pcp_size: int, hf_config: Mapping[str, object]) -> None:
    """Raise ConfigError unless vLLM will hold `model`'s MLA latents unpacked, whole on every rank."""
    if cache_dtype != "auto":
        raise ConfigError(f"{model}: kvstore stores MLA latents unpacked in the model's dtype, but "
                          f"kv_cache_dtype={cache_dtype!r} packs them: set kv_cache_dtype='auto' (or run without "
                          f"the kvstore connector)")
    for name, size in (("decode_context_parallel_size", dcp_size), ("prefill_context_parallel_size", pcp_size)):
        if size > 1:
            raise ConfigError(f"{model}: {name}={size} splits each MLA latent cache by token across ranks, and "
                              f"kvstore stores whole latents: set {name}=1")
    model_type = str(hf_config.get("model_type", ""))
    if model_type in _SPARSE_MODEL_TYPES or any(hf_config.get(key) for key in _SPARSE_MARKERS):
        raise ConfigError(f"{model}: DeepSeek sparse attention (model_type {model_type!r}, index_topk) keeps an "
                          f"indexer cache beside the MLA latent, which kvstore does not store: serve it without "
                          f"the kvstore connector, or a dense-attention MLA model (DeepSeek-V2/V3/R1, Kimi-K2)")


def cpu_rope_warning(custom_ops: Sequence[str]) -> str | None:
    """The warning for vLLM's CPU rope kernel on MLA's strided k_pe (module docstring), or None when vLLM runs its
    torch rope (custom_ops off for rotary_embedding)."""
    ops = set(custom_ops)
    kernel = "+rotary_embedding" in ops or ("none" not in ops and "-rotary_embedding" not in ops)
    if not kernel:
        return None
    return ("vLLM's CPU rotary_embedding kernel misplaces MLA's k_pe (it ignores the key's stride): answers depend "
            "on how a prompt is split into steps, a kvstore hit's too; set compilation_config "
            "custom_ops=['all', '-rotary_embedding'] for vLLM's torch rope")
