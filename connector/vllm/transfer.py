"""The vLLM connector's worker side (pure torch, no vllm import): kvstore chunks <-> vLLM's paged caches.

A load fetches the chunks of [start_token, end_token) (within the store's load deadline), then scatters
each into the request's blocks at or after start_token (a prompt's partial last chunk, handed over by a
prefill instance, into the blocks it covers). A chunk the store cannot return (evicted
meanwhile, failed checksum, daemon gone or past its deadline) and every chunk after it are not written:
their block ids are reported as load errors, so vLLM recomputes them. A save gathers the chunks at once
(the blocks may be reused after the step) and queues them on the store's bounded save queue: the step
never waits for a save. A rank that holds the same bytes as another (an MLA latent on TP rank > 0:
kvstore.kv_scope.shard_role) loads but never saves: rank 0 saves them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from connector.engine_store import EngineStore
from connector.plugin_store import load_buffer
from connector.vllm.handoff import wait_until_held
from connector.vllm.paged import PagedKind, gather_chunk, scatter_layer
from connector.vllm.plan import TransferSpec
from connector.vllm.transfer_counters import TransferCounters
from kvstore.kv_scope import shard_keys

logger = logging.getLogger(__name__)


class PagedTransfer(TransferCounters):
    """Moves whole chunks between `store` and vLLM's per-layer caches (`caches[l]` is layer l) for the shard
    (tp_rank, pp_rank) of the KV this worker holds (the ranks its keys carry); `writes`: False on a rank whose
    bytes another rank saves."""

    def __init__(self, store: EngineStore, caches: Sequence[torch.Tensor], kind: PagedKind, block_size: int, *,
                 tp_rank: int = 0, pp_rank: int = 0, writes: bool = True) -> None:
        self.store = store
        self.layout = store.layout
        self.caches = list(caches)
        self.kind = kind
        self.block_size = block_size
        self.tp_rank, self.pp_rank, self.writes = tp_rank, pp_rank, writes
        self.blocks_per_chunk = self.layout.chunk_tokens // block_size
        super().__init__()

    def _empty_chunk(self) -> torch.Tensor:
        return load_buffer(self.store)  # the daemon's pooled one-copy buffer (vLLM's inference_mode handled)

    def load(self, spec: TransferSpec) -> set[int]:
        """Fill the spec's blocks from the store; returns the block ids that could not be loaded."""
        start = time.perf_counter()
        failed = self._load(spec)
        self._count(load_seconds=time.perf_counter() - start, background_loads=int(spec.background),
                    step_loads=int(not spec.background))
        return failed

    def _load(self, spec: TransferSpec) -> set[int]:
        keys = shard_keys(spec.keys, self.tp_rank, self.pp_rank)
        if spec.wait_s > 0:  # announced by a prefill instance: some may still be on their way to the store
            waited = wait_until_held(self.store.lookup_keys, keys, spec.wait_s,
                                     store_down=lambda: self.store.breaker.is_open)
            self._count(handoff_waits=1, handoff_wait_seconds=waited)
        outs = [self._empty_chunk() for _ in keys]
        found = self.store.get_many(keys, outs)  # past the load deadline: all False, outs left to the late call
        start_block = spec.start_token // self.block_size
        for i, (chunk, hit) in enumerate(zip(outs, found, strict=True)):
            chunk_first_block = (spec.first_chunk + i) * self.blocks_per_chunk
            end_block = min(chunk_first_block + self.blocks_per_chunk, len(spec.block_ids))  # a partial chunk: fewer
            blocks = range(max(chunk_first_block, start_block), end_block)
            if not hit:
                self._count(failed_chunks=len(keys) - i)
                return set(spec.block_ids[blocks.start:])
            offset = (blocks.start - chunk_first_block) * self.block_size
            ids = [spec.block_ids[b] for b in blocks]
            for layer, cache in enumerate(self.caches):
                scatter_layer(chunk[layer][:, offset:offset + len(ids) * self.block_size], self.kind, ids, cache)
            self._count(loaded_chunks=1, loaded_bytes=self.layout.chunk_bytes)
        return set()

    def save(self, specs: Sequence[TransferSpec]) -> None:
        """Gather the specs' chunks now; queue them for the store (never waits for the store)."""
        if not self.writes:
            return
        start = time.perf_counter()
        keys: list[bytes] = []
        chunks: list[torch.Tensor] = []
        for spec in specs:
            for i, key in enumerate(shard_keys(spec.keys, self.tp_rank, self.pp_rank)):
                index = spec.first_chunk + i
                ids = list(spec.block_ids[index * self.blocks_per_chunk:(index + 1) * self.blocks_per_chunk])
                ids += ids[-1:] * (self.blocks_per_chunk - len(ids))  # a partial chunk: its last block again
                keys.append(key)
                chunks.append(gather_chunk(self.caches, self.kind, ids, self._empty_chunk()))
        self._queue_saves(self.store, keys, chunks, self.layout.chunk_bytes, start)

    def wait(self) -> None:
        """Block until every queued save has been handed to the store."""
        self.store.wait_saves()
