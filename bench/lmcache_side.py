"""LMCache 0.5.6's own engine on CPU for `kvstore bench lmcache`: imported only where LMCache is installed.

Everything is LMCache's code (LMCacheEngine, its token database, StorageManager, LocalCPUBackend and
allocator) except the GPU connector, which on CPU copies one chunk tensor's bytes to or from a
memory object, the same copy kvstore's host tier makes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

import torch
from lmcache.v1.cache_engine import LMCacheEngine, LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface
from lmcache.v1.metadata import LMCacheMetadata

from kvstore.layout import KVLayout

_ids = itertools.count()


class MemoryObj(Protocol):
    """lmcache.v1.memory_management.MemoryObj: a chunk's memory in LMCache's local CPU backend."""

    @property
    def tensor(self) -> torch.Tensor: ...  # LMCache types it Optional; its CPU allocator's objects have one


class ChunkCopyConnector(GPUConnectorInterface):
    """LMCache's connector contract on CPU: `chunks[start // chunk_tokens]` is the chunk's memory (the
    `chunks=` keyword the bench passes to LMCacheEngine.store/retrieve, which LMCache hands on here)."""

    def __init__(self, chunk_tokens: int) -> None:
        self.chunk_tokens = chunk_tokens

    def _flat(self, memory_obj: MemoryObj) -> torch.Tensor:
        return memory_obj.tensor.reshape(-1)

    # **kwargs: the rest of what LMCache hands on from store/retrieve (unused here)
    def from_gpu(self, memory_obj: MemoryObj, start: int, end: int, *, chunks: Sequence[torch.Tensor],
                 **kwargs: object) -> None:
        self._flat(memory_obj).copy_(chunks[start // self.chunk_tokens].reshape(-1))

    def to_gpu(self, memory_obj: MemoryObj, start: int, end: int, *, chunks: Sequence[torch.Tensor],
               **kwargs: object) -> None:
        chunks[start // self.chunk_tokens].reshape(-1).copy_(self._flat(memory_obj))

    def batched_from_gpu(self, memory_objs: Sequence[MemoryObj], starts: Sequence[int], ends: Sequence[int], *,
                         chunks: Sequence[torch.Tensor], **kwargs: object) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(obj, start, end, chunks=chunks, **kwargs)

    def batched_to_gpu(self, memory_objs: Sequence[MemoryObj], starts: Sequence[int], ends: Sequence[int], *,
                       chunks: Sequence[torch.Tensor], **kwargs: object) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(obj, start, end, chunks=chunks, **kwargs)

    def get_shape(self, num_tokens: int) -> torch.Size:
        raise NotImplementedError("not used by store/retrieve")


def make_engine(layout: KVLayout, capacity_bytes: int) -> tuple[str, LMCacheEngine]:
    """An LMCacheEngine with only its local CPU backend, `capacity_bytes` large, for `layout`'s model."""
    config = LMCacheEngineConfig.from_defaults(chunk_size=layout.chunk_tokens, local_cpu=True,
                                               max_local_cpu_size=capacity_bytes / 2**30, save_unfull_chunk=False)
    shape = (layout.num_layers, 2, layout.chunk_tokens, layout.num_kv_heads, layout.head_dim)
    metadata = LMCacheMetadata(model_name="llama-3-8b-bench", world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=layout.torch_dtype, kv_shape=shape,
                               chunk_size=layout.chunk_tokens)
    instance_id = f"kvstore-bench-{next(_ids)}"
    engine = LMCacheEngineBuilder.get_or_create(instance_id, config, metadata,
                                                ChunkCopyConnector(layout.chunk_tokens),
                                                lambda t, r: None, lambda o, r: o)
    engine.post_init()
    return instance_id, engine


def close_engine(instance_id: str) -> None:
    LMCacheEngineBuilder.destroy(instance_id)
