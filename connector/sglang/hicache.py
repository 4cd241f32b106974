"""`KVStoreHiCacheStorage`: SGLang's HiCache L3 storage backend over kvstore (HiCacheStorage, v1 zero-copy API).

Start SGLang with::

    --enable-hierarchical-cache --page-size 64 --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvstore",
        "module_path": "connector.sglang.hicache", "class_name": "KVStoreHiCacheStorage",
        "interface_v1": 1, "url": "http://127.0.0.1:8765"}'

One SGLang page is one kvstore chunk: the layout registered with the daemon has SGLang's page size as its
chunk tokens (a daemon with a [layout] must have that chunk_tokens; one with none serves any).
SGLang names a page by its own chained prefix hash (a string), so a page maps to one kvstore key and
`batch_exists` (leading pages present) is kvstore's prefix lookup. With interface_v1 SGLang hands
the backend host-pool indices (`batch_get_v1` / `batch_set_v1`): pages are read from and written
into SGLang's host pool in place, one copy each way between the pool's layout and kvstore's
canonical [layers, 2, page, heads, dim] chunk. A set copies the pages into buffers of its own and
queues them on the store's bounded save queue (connector/guarded_store.py): SGLang's backup thread never
waits for the daemon. MHA host pools in the layer_first, page_first,
page_first_direct and page_head layouts are supported; MLA pools are refused at registration.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo

from connector.engine_store import StoreOptions, load_buffer, owned_buffer
from connector.guarded_store import GuardedStore, open_guarded
from kvstore.errors import ConfigError
from kvstore.kv_scope import ModelIdentity, named_key, shard_keys
from kvstore.layout import KVLayout

logger = logging.getLogger(__name__)
_SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1", "interface_v2")


class HostPool(Protocol):
    """What the backend reads of SGLang's MHA host pool (sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost)."""

    @property
    def kv_buffer(self) -> torch.Tensor: ...
    @property
    def layout(self) -> str: ...  # layer_first, page_first, page_first_direct or page_head (page_view)
    @property
    def page_size(self) -> int: ...
    @property
    def layer_num(self) -> int: ...
    @property
    def head_num(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def v_head_dim(self) -> int: ...
    @property
    def dtype(self) -> torch.dtype: ...


def page_view(kv_buffer: torch.Tensor, layout: str, index: int, page_size: int) -> torch.Tensor:
    """The host pool's page starting at token `index` as a [layers, 2, page, heads, dim] view (no copy)."""
    if layout == "layer_first":  # [2, layers, tokens, heads, dim]
        return kv_buffer[:, :, index:index + page_size].transpose(0, 1)
    if layout == "page_first":  # [2, tokens, layers, heads, dim]
        return kv_buffer[:, index:index + page_size].permute(2, 0, 1, 3, 4)
    page = index // page_size
    if layout == "page_first_direct":  # [2, pages, layers, page, heads, dim]
        return kv_buffer[:, page].transpose(0, 1)
    if layout == "page_head":  # [2, pages, heads, page, layers, dim]
        return kv_buffer[:, page].permute(3, 0, 2, 1, 4)
    raise ConfigError(f"SGLang host pool layout {layout!r} is not supported by the kvstore backend; "
                      "use layer_first, page_first, page_first_direct or page_head")


class KVStoreHiCacheStorage(HiCacheStorage):
    """HiCache storage in a kvstore daemon (`url`) or an embedded kvstore (`config` / `root_dir`)."""

    mem_pool_host: HostPool  # set by HiCacheStorage.register_mem_pool_host

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict[str, object] | None = None) -> None:
        if storage_config.is_mla_model:
            raise ConfigError("the kvstore HiCache backend stores MHA pages; MLA host pools are not supported yet")
        self.options = StoreOptions.from_mapping(storage_config.extra_config or {}, ignore=_SGLANG_KEYS)
        self._config = storage_config
        self._root = b""
        self.store: GuardedStore | None = None
        self.counters = {"get_hits": 0, "get_misses": 0, "set_pages": 0, "set_failed": 0}

    def register_mem_pool_host(self, mem_pool_host: HostPool) -> None:
        """Learn the page geometry from SGLang's host pool and open the store with that layout."""
        super().register_mem_pool_host(mem_pool_host)
        pool = mem_pool_host
        if pool.head_dim != pool.v_head_dim:
            raise ConfigError(f"K width {pool.head_dim} != V width {pool.v_head_dim}: kvstore chunks need equal widths")
        page_view(pool.kv_buffer, pool.layout, 0, pool.page_size)  # refuses unsupported layouts now
        self.layout = KVLayout(num_layers=pool.layer_num, num_kv_heads=pool.head_num, head_dim=pool.head_dim,
                               dtype=str(pool.dtype).removeprefix("torch."), chunk_tokens=pool.page_size)
        if self.store is not None:
            self.store.close()
        self.store = open_guarded(self.options, self.layout, "sglang-hicache",
                                  model=self.options.model_id or str(self._config.model_name))
        cfg = self._config
        identity = ModelIdentity(model=self.options.model_id or str(cfg.model_name), kv_dtype=self.layout.dtype,
                                 layout_fingerprint=self.layout.fingerprint, tp_size=int(cfg.tp_size),
                                 pp_size=int(cfg.pp_size), engine="sglang")
        self._root = identity.scope().root(self.store.root_key)  # SGLang's page hash carries its own extra keys

    def _store(self) -> GuardedStore:
        if self.store is None:
            raise ConfigError("the kvstore backend has no host pool yet: SGLang calls register_mem_pool_host first")
        return self.store

    def _keys(self, keys: list[str]) -> list[bytes]:
        cfg = self._config
        return shard_keys([named_key(self._root, k) for k in keys], int(cfg.tp_rank), int(cfg.pp_rank))

    def _pages(self, host_indices: torch.Tensor, count: int) -> list[torch.Tensor]:
        pool, size = self.mem_pool_host, self.layout.chunk_tokens
        if len(host_indices) != count * size:
            raise ConfigError(f"{count} pages need {count * size} host indices, got {len(host_indices)}")
        starts = host_indices[::size].tolist()
        return [page_view(pool.kv_buffer, pool.layout, int(i), size) for i in starts]

    # ----- v1 zero-copy interface ---------------------------------------------------------------
    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """Leading pages present: kvstore's prefix lookup."""
        return self._store().lookup_keys(self._keys(keys))

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        pages = self._pages(host_indices, len(keys))
        scratch = [load_buffer(self._store()) for _ in keys]  # pooled: the daemon fills them, one copy
        found = self._store().get_many(self._keys(keys), scratch)
        for page, chunk, hit in zip(pages, scratch, found, strict=True):
            if hit:
                page.copy_(chunk)
        self.counters["get_hits"] += sum(found)
        self.counters["get_misses"] += len(found) - sum(found)
        return found

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """Copy the pages out of SGLang's host pool and queue them on the store's bounded save queue: True for
        each page queued (SGLang may reuse its memory now), False for those the full queue dropped."""
        return self._save(self._keys(keys), self._pages(host_indices, len(keys)))

    def _save(self, keys: list[bytes], pages: Sequence[torch.Tensor]) -> list[bool]:
        store = self._store()
        queued = store.save_async(keys, [owned_buffer(store, page) for page in pages])
        self.counters["set_pages"] += queued
        self.counters["set_failed"] += len(keys) - queued
        return [i < queued for i in range(len(keys))]

    # ----- legacy interface (flat pages [2, layers, page, heads, dim]) ---------------------------
    def _flat_shape(self) -> tuple[int, ...]:
        lay = self.layout
        return (2, lay.num_layers, lay.chunk_tokens, lay.num_kv_heads, lay.head_dim)

    # target_sizes: SGLang's byte sizes for backends that write to raw addresses; a flat page tensor needs none
    def get(self, key: str, target_location: torch.Tensor | None = None,
            target_sizes: object = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]  # type: ignore[index]

    def batch_get(self, keys: list[str], target_locations: Sequence[torch.Tensor | None] | None = None,
                  target_sizes: object = None) -> list[torch.Tensor | None]:
        outs = [load_buffer(self._store()) for _ in keys]
        found = self._store().get_many(self._keys(keys), outs)
        targets = list(target_locations or [None] * len(keys))
        result: list[torch.Tensor | None] = []
        for chunk, hit, target in zip(outs, found, targets, strict=True):
            flat = target if target is not None else torch.empty(chunk.numel(), dtype=chunk.dtype)
            if hit:
                flat.view(self._flat_shape()).copy_(chunk.transpose(0, 1))
            result.append(flat if hit else None)
        return result

    def set(self, key: str, value: torch.Tensor, target_location: object = None,
            target_sizes: object = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Sequence[torch.Tensor] | None = None, target_locations: object = None,
                  target_sizes: object = None) -> bool:
        return all(self._save(self._keys(keys), [v.view(self._flat_shape()).transpose(0, 1) for v in values or []]))

    def exists(self, key: str) -> bool:
        return self._store().lookup_keys(self._keys([key])) == 1

    def get_stats(self) -> dict[str, int]:
        return dict(self.counters)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None
