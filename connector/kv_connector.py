"""`KVConnector`: the engine-facing API over a TieredStore, split like vLLM's KV connector v1.

    scheduler side:  get_num_matched_tokens(token_ids)        how many leading tokens the store holds
    worker side:     start_load(...) -> handle; wait_for_load(handle) -> tokens loaded
                     save(...) (gathers now, stores in the background); wait_for_save()

The store is any `kvstore.types.ChunkStore`: the embedded TieredStore or the sidecar's
KVStoreClient, without changing this file. This is the connector of kvstore's own small engine
(connector/engine/); vLLM's is `KVStoreConnector` (connector/vllm/), and what every engine plugin
holds of the store is an `EngineStore` (connector/engine_store.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from gpu_kernels import gather_blocks, scatter_blocks
from kvstore.errors import ConfigError, KVStoreError
from kvstore.kv_scope import KeyScope
from kvstore.types import ChunkStore

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadHandle:
    """An in-flight load of tokens [start_token, end_token) into a request's pages."""

    start_token: int
    end_token: int
    future: Future[int]


class KVConnector:
    """Loads and saves whole chunks between an engine's paged KV cache and the store.

    The engine's cache is one tensor [num_layers, 2, num_blocks, page_size, kv_heads, head_dim];
    a chunk is `chunk_tokens / page_size` pages, gathered into the store's canonical
    [num_layers, 2, chunk_tokens, kv_heads, head_dim].
    """

    def __init__(self, store: ChunkStore, page_size: int, *, num_workers: int = 2, scope: KeyScope | None = None) -> None:
        self.store = store
        self.scope = scope  # what the KV is valid for (kvstore.kv_scope); None: the store's own key space
        self.layout = store.layout
        self.page_size = page_size
        if self.layout.chunk_tokens % page_size:
            raise ConfigError(
                f"store chunk_tokens ({self.layout.chunk_tokens}) must be a multiple of the engine page size "
                f"({page_size}); pick KVLayout(chunk_tokens=k*{page_size})"
            )
        self.pages_per_chunk = self.layout.chunk_tokens // page_size
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="kv-connector")
        self._saves: list[Future[int]] = []
        self._lock = threading.Lock()
        self.counters = {"loaded_chunks": 0, "load_failed_chunks": 0, "saved_chunks": 0, "save_failed_chunks": 0}

    @property
    def chunk_tokens(self) -> int:
        return int(self.layout.chunk_tokens)

    # ----- scheduler side ---------------------------------------------------------------
    def get_num_matched_tokens(self, token_ids: Sequence[int], *, max_tokens: int | None = None) -> int:
        """Leading tokens of `token_ids` (at most `max_tokens`, whole chunks) held by the store."""
        limit = len(token_ids) if max_tokens is None else min(max_tokens, len(token_ids))
        return int(self.store.lookup(list(token_ids[: limit - limit % self.chunk_tokens]), self.scope))

    lookup = get_num_matched_tokens

    @property
    def num_saved_chunks(self) -> int:
        """Chunks this connector's saves have stored so far: a lookup's answer may have grown since it changed."""
        return self.counters["saved_chunks"]

    # ----- worker side: load ------------------------------------------------------------
    def start_load(self, token_ids: Sequence[int], block_ids: Sequence[int], kv_cache: torch.Tensor, *,
                   start_token: int, end_token: int) -> LoadHandle:
        """Begin loading tokens [start_token, end_token) (chunk aligned) into their pages of `kv_cache`."""
        c = self.chunk_tokens
        if start_token % c or end_token % c or end_token > len(token_ids) or -(-end_token // self.page_size) > len(block_ids):
            raise KVStoreError(
                f"load range [{start_token}, {end_token}) must be chunk aligned ({c}) and within the "
                f"{len(token_ids)} tokens / {len(block_ids)} pages of the request"
            )
        keys = self.store.chunk_keys(list(token_ids[:end_token]), self.scope)[start_token // c :]
        future = self._pool.submit(self._load, keys, list(block_ids), kv_cache, start_token // c)
        return LoadHandle(start_token=start_token, end_token=end_token, future=future)

    def wait_for_load(self, handle: LoadHandle) -> int:
        """Tokens actually loaded from `handle.start_token` on (a leading run of chunks; the rest must be recomputed)."""
        return handle.future.result()

    def load(self, token_ids: Sequence[int], block_ids: Sequence[int], kv_cache: torch.Tensor, *,
             start_token: int = 0, end_token: int | None = None) -> int:
        """Blocking load; `end_token` defaults to everything the store holds. Returns tokens loaded."""
        if end_token is None:
            end_token = self.get_num_matched_tokens(token_ids)
        if end_token <= start_token:
            return 0
        return self.wait_for_load(self.start_load(token_ids, block_ids, kv_cache, start_token=start_token, end_token=end_token))

    def _load(self, keys: list[bytes], block_ids: list[int], kv_cache: torch.Tensor, first_chunk: int) -> int:
        # Staging buffers on the cache's device: the store reads straight into GPU memory when it is there.
        outs = [torch.empty(self.layout.chunk_shape, dtype=kv_cache.dtype, device=kv_cache.device) for _ in keys]
        found = self.store.get_many(keys, outs)
        num_ok = next((i for i, ok in enumerate(found) if not ok), len(found))
        for i in range(num_ok):
            scatter_blocks(outs[i], self._chunk_blocks(block_ids, first_chunk + i), kv_cache)
        with self._lock:
            self.counters["loaded_chunks"] += num_ok
            self.counters["load_failed_chunks"] += len(keys) - num_ok
        if num_ok < len(keys):
            logger.info("load: %d of %d chunks missing or unreadable; the engine recomputes from token %d",
                        len(keys) - num_ok, len(keys), (first_chunk + num_ok) * self.chunk_tokens)
        return num_ok * self.chunk_tokens

    def _chunk_blocks(self, block_ids: Sequence[int], chunk_index: int) -> list[int]:
        p = self.pages_per_chunk
        return list(block_ids[chunk_index * p : (chunk_index + 1) * p])

    # ----- worker side: save ------------------------------------------------------------
    def save(self, token_ids: Sequence[int], block_ids: Sequence[int], kv_cache: torch.Tensor, *,
             num_tokens: int | None = None, first_chunk: int = 0) -> int:
        """Save the full chunks among tokens [first_chunk * chunk_tokens, num_tokens).

        The pages are gathered now (the caller may reuse them right after); the store put runs
        in the background until `wait_for_save`. Returns the number of chunks queued.
        """
        num_tokens = len(token_ids) if num_tokens is None else min(num_tokens, len(token_ids))
        last_chunk = num_tokens // self.chunk_tokens
        if last_chunk <= first_chunk:
            return 0
        keys = self.store.chunk_keys(list(token_ids[: last_chunk * self.chunk_tokens]), self.scope)[first_chunk:]
        chunks = []
        for i in range(first_chunk, last_chunk):
            out = torch.empty(self.layout.chunk_shape, dtype=kv_cache.dtype, device=kv_cache.device)
            chunks.append(gather_blocks(kv_cache, self._chunk_blocks(block_ids, i), out))
        with self._lock:
            self._saves.append(self._pool.submit(self._put, keys, chunks))
        return len(keys)

    def _put(self, keys: list[bytes], chunks: list[torch.Tensor]) -> int:
        result = self.store.put_many(keys, chunks)
        with self._lock:
            self.counters["saved_chunks"] += len(result.stored)
            self.counters["save_failed_chunks"] += len(result.not_stored)
        if result.not_stored:
            logger.info("save: %d chunks not stored: %s", len(result.not_stored), next(iter(result.not_stored.values())))
        return len(result.stored)

    def wait_for_save(self) -> int:
        """Wait for every queued save; returns the chunks stored by them."""
        with self._lock:
            pending, self._saves = self._saves, []
        return sum(f.result() for f in pending)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counters)

    def close(self) -> None:
        """Finish pending saves and stop the worker threads (the store stays open: the caller owns it)."""
        self.wait_for_save()
        self._pool.shutdown(wait=True)
