"""What a vLLM request's KV is valid for (pure Python, no vllm import): the model identity from vLLM's
config, and each request's scope from its LoRA adapter, `cache_salt` and multimodal inputs.

vLLM's own prefix cache keys blocks on the same things (the LoRA name and path, the salt on the first
block, each multimodal item's content hash and position); a prompt given as embeddings has no token ids
to name its KV, so it is never cached here.
"""

from __future__ import annotations

from connector.vllm.paged import cpu_isa_scope
from connector.vllm.vllm_types import VllmConfigView, VllmRequest
from kvstore.kv_scope import KeyScope, ModelIdentity, shard_role
from kvstore.layout import KVLayout


def identity_from_vllm(vllm_config: VllmConfigView, layout: KVLayout, model_id: str | None, *,
                       cpu_isa: str | None = None) -> ModelIdentity:
    """The model vLLM serves: `model_id` when the user names the weights, else vLLM's model (name or path)
    and revision; the KV dtype and layout; the tensor- and pipeline-parallel sizes; on vLLM's CPU backend,
    its attention ISA's layout tag (connector.vllm.paged.cpu_isa_scope)."""
    model, parallel = vllm_config.model_config, vllm_config.parallel_config
    return vllm_identity(str(model.model), layout, revision=str(model.revision or ""), model_id=model_id,
                         tp_size=int(parallel.tensor_parallel_size), pp_size=int(parallel.pipeline_parallel_size),
                         cpu_isa=cpu_isa)


def vllm_identity(model: str, layout: KVLayout, *, revision: str = "", model_id: str | None = None, tp_size: int = 1,
                  pp_size: int = 1, cpu_isa: str | None = None) -> ModelIdentity:
    """The identity the vLLM connector gives a model (also for tools that write or inspect its chunks); an MLA
    layout's names no TP size (every rank holds the same latent: kvstore.kv_scope.shard_role)."""
    tag = cpu_isa_scope(cpu_isa)
    return ModelIdentity(model=model_id or model, revision="" if model_id else revision, kv_dtype=layout.dtype,
                         layout_fingerprint=layout.fingerprint, tp_size=shard_role(layout.kind, tp_size, 0).key_tp_size,
                         pp_size=pp_size,
                         engine=f"vllm|{tag}" if tag else "vllm")


def request_scope(identity: ModelIdentity, request: VllmRequest) -> KeyScope | None:
    """A vLLM `Request`'s scope, or None when its KV cannot be named by token ids (prompt embeddings)."""
    if request.prompt_embeds is not None or request.prompt_token_ids is None:
        return None
    lora = request.lora_request
    adapter = f"{lora.lora_name}\0{lora.lora_path}" if lora is not None else ""
    salt = request.cache_salt or ""
    mm = [f"{f.identifier}@{f.mm_position.offset}+{f.mm_position.length}" for f in (request.mm_features or [])]
    if mm:  # the KV after an image depends on it; conservative: every chunk of the request depends on all of them
        salt = f"{salt}\0mm:" + ",".join(mm)
    return identity.scope(adapter=adapter, salt=salt)
