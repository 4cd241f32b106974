"""The vLLM connector's worker side (pure torch, no vllm import): kvstore chunks <-> vLLM's paged caches.

A load fetches the chunks of [start_token, end_token), then scatters each into the request's blocks
at or after start_token. A chunk the store cannot return (evicted meanwhile, failed checksum, daemon
gone) and every chunk after it are not written: their block ids are reported as load errors, so
vLLM recomputes them. A save gathers the chunks at once (the blocks may be reused after the step)
and stores them on a background thread, one batch in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from connector.engine_store import EngineStore, load_buffer
from connector.vllm.paged import PagedKind, gather_chunk, scatter_layer
from connector.vllm.plan import TransferSpec
from kvstore.errors import KVStoreError

logger = logging.getLogger(__name__)


class PagedTransfer:
    """Moves whole chunks between `store` and vLLM's per-layer caches (`caches[l]` is layer l)."""

    def __init__(self, store: EngineStore, caches: Sequence[torch.Tensor], kind: PagedKind, block_size: int) -> None:
        self.store = store
        self.layout = store.layout
        self.caches = list(caches)
        self.kind = kind
        self.block_size = block_size
        self.blocks_per_chunk = self.layout.chunk_tokens // block_size
        self._saver = ThreadPoolExecutor(1, thread_name_prefix="kvstore-vllm-save")
        self._pending: Future[None] | None = None
        self.counters = {"loaded_chunks": 0, "failed_chunks": 0, "saved_chunks": 0, "unsaved_chunks": 0}

    def _empty_chunk(self) -> torch.Tensor:
        return load_buffer(self.store)  # the daemon's pooled one-copy buffer (vLLM's inference_mode handled)

    def load(self, spec: TransferSpec) -> set[int]:
        """Fill the spec's blocks from the store; returns the block ids that could not be loaded."""
        size = self.layout.chunk_tokens
        first, last = spec.start_token // size, -(-spec.end_token // size)
        keys = self.store.chunk_keys(list(spec.token_ids[:last * size]))[first:last]
        outs = [self._empty_chunk() for _ in keys]
        try:
            found = self.store.get_many(keys, outs) if len(keys) == last - first else [False] * (last - first)
        except KVStoreError as exc:  # e.g. the daemon answered garbage: recompute, never fail the request
            logger.warning("kvstore load of %d chunks failed (%s); vLLM recomputes them", len(keys), exc)
            found = [False] * (last - first)
        start_block = spec.start_token // self.block_size
        for i, (chunk, hit) in enumerate(zip(outs, found, strict=True)):
            chunk_first_block = (first + i) * self.blocks_per_chunk
            blocks = range(max(chunk_first_block, start_block), chunk_first_block + self.blocks_per_chunk)
            if not hit:
                self.counters["failed_chunks"] += last - first - i
                return set(spec.block_ids[blocks.start:])
            offset = (blocks.start - chunk_first_block) * self.block_size
            ids = [spec.block_ids[b] for b in blocks]
            for layer, cache in enumerate(self.caches):
                scatter_layer(chunk[layer][:, offset:], self.kind, ids, cache)
            self.counters["loaded_chunks"] += 1
        return set()

    def save(self, specs: Sequence[TransferSpec]) -> None:
        """Gather the specs' chunks now; store them in the background (waits for the previous batch)."""
        keys: list[bytes] = []
        chunks: list[torch.Tensor] = []
        size = self.layout.chunk_tokens
        for spec in specs:
            all_keys = self.store.chunk_keys(list(spec.token_ids))
            for index in range(spec.start_token // size, spec.end_token // size):
                ids = spec.block_ids[index * self.blocks_per_chunk:(index + 1) * self.blocks_per_chunk]
                keys.append(all_keys[index])
                chunks.append(gather_chunk(self.caches, self.kind, ids, self._empty_chunk()))
        if not keys:
            return
        self.wait()
        self._pending = self._saver.submit(self._put, keys, chunks)

    def _put(self, keys: list[bytes], chunks: list[torch.Tensor]) -> None:
        try:
            result = self.store.put_many(keys, chunks)
        except KVStoreError as exc:
            logger.warning("kvstore save of %d chunks failed: %s", len(keys), exc)
            self.counters["unsaved_chunks"] += len(keys)
            return
        self.counters["saved_chunks"] += len(result.stored)
        self.counters["unsaved_chunks"] += len(result.not_stored)
        if result.not_stored:
            logger.warning("kvstore: %d chunks not stored (%s)", len(result.not_stored),
                           next(iter(result.not_stored.values())))

    def wait(self) -> None:
        """Block until the save batch in flight is stored."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def close(self) -> None:
        self.wait()
        self._saver.shutdown(wait=True)
