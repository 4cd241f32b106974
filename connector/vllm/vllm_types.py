"""What the vLLM connector reads of vLLM's own objects, as Protocols (pure Python, no vllm import).

vLLM is not installed where kvstore is type-checked, so its classes are unknown there; these name the
fields the connector relies on (vLLM 0.32's), each after the vLLM class it stands for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class VllmLoRARequest(Protocol):
    """vllm.lora.request.LoRARequest."""

    @property
    def lora_name(self) -> str: ...
    @property
    def lora_path(self) -> str: ...


class VllmPlaceholderRange(Protocol):
    """vllm.multimodal.inputs.PlaceholderRange: where a multimodal item sits in the prompt."""

    @property
    def offset(self) -> int: ...
    @property
    def length(self) -> int: ...


class VllmMultiModalFeature(Protocol):
    """vllm.multimodal.inputs.MultiModalFeatureSpec: one multimodal item, named by its content hash."""

    @property
    def identifier(self) -> str: ...
    @property
    def mm_position(self) -> VllmPlaceholderRange: ...


class VllmRequest(Protocol):
    """vllm.v1.request.Request, as the scheduler half of the connector sees it."""

    @property
    def request_id(self) -> str: ...
    @property
    def prompt_token_ids(self) -> Sequence[int] | None: ...
    @property
    def prompt_embeds(self) -> object: ...  # a torch.Tensor or None: only tested against None
    @property
    def lora_request(self) -> VllmLoRARequest | None: ...
    @property
    def cache_salt(self) -> str | None: ...
    @property
    def mm_features(self) -> Sequence[VllmMultiModalFeature] | None: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def all_token_ids(self) -> Sequence[int]: ...
    @property
    def block_hashes(self) -> Sequence[bytes]: ...  # one per full block, vLLM's prefix-cache hashes
    @property
    def kv_transfer_params(self) -> Mapping[str, object] | None: ...


class VllmNewRequestData(Protocol):
    """vllm.v1.core.sched.output.NewRequestData: a request scheduled for the first time."""

    @property
    def req_id(self) -> str: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def block_ids(self) -> Sequence[Sequence[int]]: ...  # per KV cache group


class VllmCachedRequestData(Protocol):
    """vllm.v1.core.sched.output.CachedRequestData: the requests scheduled again, column by column."""

    @property
    def req_ids(self) -> Sequence[str]: ...
    @property
    def num_computed_tokens(self) -> Sequence[int]: ...


class VllmSchedulerOutput(Protocol):
    """vllm.v1.core.sched.output.SchedulerOutput: one step's schedule."""

    @property
    def scheduled_new_reqs(self) -> Sequence[VllmNewRequestData]: ...
    @property
    def scheduled_cached_reqs(self) -> VllmCachedRequestData: ...
    @property
    def num_scheduled_tokens(self) -> Mapping[str, int]: ...


class VllmConnectorOutput(Protocol):
    """vllm.v1.outputs.KVConnectorOutput: what the workers' connectors reported for a step."""

    @property
    def kv_connector_stats(self) -> object: ...  # a KVConnectorStats (ours: KVStoreConnectorStats) or None


class VllmModelConfig(Protocol):
    """vllm.config.ModelConfig: the model's name or path and revision."""

    @property
    def model(self) -> str: ...
    @property
    def revision(self) -> str | None: ...


class VllmParallelConfig(Protocol):
    """vllm.config.ParallelConfig: how the model is split."""

    @property
    def tensor_parallel_size(self) -> int: ...
    @property
    def pipeline_parallel_size(self) -> int: ...


class VllmConfigView(Protocol):
    """vllm.config.VllmConfig: the parts that name the model a chunk belongs to."""

    @property
    def model_config(self) -> VllmModelConfig: ...
    @property
    def parallel_config(self) -> VllmParallelConfig: ...
