"""The worker side for a Mamba / linear-attention KV cache group: one state page per layer and chunk boundary.

vLLM hands a connector each state layer's cache as one int8 page per block, `[num_blocks, heads, states,
state_bytes]` (its layer unpacks the page into conv and SSM views: `MambaBase.bind_kv_cache`). In "align" mode the
block that ends at a boundary holds the state after the boundary's last token (connector.vllm.groups), so a
boundary's piece is that one block of every layer of the group: a chunk of layout
[num_layers, 1, 1, 1, page_bytes] int8 (connector.vllm.window.group_layout). The specs come from
connector.vllm.hybrid.group_specs: one key and one block each. No vllm import.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from connector.engine_store import EngineStore
from connector.plugin_store import load_buffer
from connector.vllm.plan import TransferSpec
from connector.vllm.transfer_counters import TransferCounters
from kvstore.errors import LayoutMismatchError
from kvstore.kv_scope import shard_keys

_GRAIN = 32768  # torch's parallel grain: smaller copies run on the calling thread (connector.vllm.paged.copy_serially)


def check_state_caches(caches: Sequence[torch.Tensor], page_bytes: int) -> None:
    """Each layer's cache must be vLLM's int8 state pages of `page_bytes` per block; LayoutMismatchError if not."""
    for cache in caches:
        if cache.dtype != torch.int8 or cache.dim() < 2 or cache[0].numel() != page_bytes:
            raise LayoutMismatchError(
                f"vLLM state cache {tuple(cache.shape)} {cache.dtype} is not int8 pages of {page_bytes} bytes per "
                f"block; the model's MambaSpec and the cache disagree")


def copy_page(dst: torch.Tensor, src: torch.Tensor) -> None:
    """One block's page, `dst.copy_(src)` (same shape, last dim contiguous) in pieces below torch's grain."""
    rows_dst, rows_src = dst.reshape(-1, dst.shape[-1]), src.reshape(-1, src.shape[-1])
    for row_dst, row_src in zip(rows_dst, rows_src, strict=True):
        for start in range(0, row_dst.shape[0], _GRAIN):
            row_dst[start:start + _GRAIN].copy_(row_src[start:start + _GRAIN])


class StateTransfer(TransferCounters):
    """Moves state pieces between `store` (the group's layout) and the group's layer caches (`caches[l]`)."""

    def __init__(self, store: EngineStore, caches: Sequence[torch.Tensor], *, tp_rank: int = 0,
                 pp_rank: int = 0) -> None:
        self.store, self.layout, self.caches = store, store.layout, list(caches)
        if len(self.caches) != self.layout.num_layers:
            raise LayoutMismatchError(f"{len(self.caches)} state caches for a {self.layout.num_layers}-layer group")
        check_state_caches(self.caches, self.layout.head_dim)
        self.tp_rank, self.pp_rank = tp_rank, pp_rank
        super().__init__()

    def _page(self, chunk: torch.Tensor, layer: int, cache: torch.Tensor) -> torch.Tensor:
        return chunk[layer].view(cache.shape[1:])  # [1, 1, 1, page_bytes] seen as the block's [heads, states, bytes]

    def load(self, spec: TransferSpec) -> set[int]:
        """Fill each spec's one block from the store; the block id when its state cannot be loaded."""
        start = time.perf_counter()
        keys = shard_keys(spec.keys, self.tp_rank, self.pp_rank)
        outs = [load_buffer(self.store) for _ in keys]
        found = self.store.get_many(keys, outs)
        failed: set[int] = set()
        for chunk, hit, block in zip(outs, found, spec.block_ids, strict=True):
            if not hit:
                failed.add(block)
                continue
            for layer, cache in enumerate(self.caches):
                copy_page(cache[block], self._page(chunk, layer, cache))
        self._count(loaded_chunks=len(keys) - len(failed), failed_chunks=len(failed),
                    loaded_bytes=(len(keys) - len(failed)) * self.layout.chunk_bytes,
                    load_seconds=time.perf_counter() - start, background_loads=int(spec.background),
                    step_loads=int(not spec.background))
        return failed

    def save(self, specs: Sequence[TransferSpec]) -> None:
        """Gather each spec's block now (vLLM frees or reuses it in a later step); queue it for the store."""
        start = time.perf_counter()
        keys: list[bytes] = []
        chunks: list[torch.Tensor] = []
        for spec in specs:
            for key, block in zip(shard_keys(spec.keys, self.tp_rank, self.pp_rank), spec.block_ids, strict=True):
                chunk = load_buffer(self.store)
                for layer, cache in enumerate(self.caches):
                    copy_page(self._page(chunk, layer, cache), cache[block])
                keys.append(key)
                chunks.append(chunk)
        self._queue_saves(self.store, keys, chunks, self.layout.chunk_bytes, start)

    def wait(self) -> None:
        self.store.wait_saves()
