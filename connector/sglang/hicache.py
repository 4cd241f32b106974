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
queues them on the store's bounded save queue (connector/engine_store.py): SGLang's backup thread never
waits for the daemon. MHA host pools in the layer_first, page_first, page_first_direct and page_head
layouts are supported.

MLA host pools (MLATokenToKVPoolHost: DeepSeek-V2/V3, Kimi...) hold one latent per token and layer,
[kv_lora_rank | rope]; a page is stored as kvstore's MLA chunk [layers, 1, page, 1, latent], in the
layer_first, page_first, page_first_direct and page_unified layouts. Every TP rank holds the same latent,
so MLA keys name no TP size or rank and only the storage writer (TP rank 0) stores pages, as SGLang's
`is_storage_writer` says (kvstore.kv_scope.shard_role). Packed latents (fp8 DSA rows) and latents split
by token (decode or attention context parallelism) are refused at registration.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo

from connector.engine_store import EngineStore
from connector.plugin_store import StoreOptions, load_buffer, open_store, owned_buffer
from kvstore.errors import ConfigError
from kvstore.kv_scope import ModelIdentity, ShardRole, named_key, shard_keys, shard_role
from kvstore.layout import AttentionKind, KVLayout

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


class MLAHostPool(Protocol):
    """What the backend reads of SGLang's MLA host pool (sglang.srt.mem_cache.pool_host.mla.MLATokenToKVPoolHost)."""

    @property
    def kv_buffer(self) -> torch.Tensor: ...
    @property
    def layout(self) -> str: ...  # layer_first, page_first, page_first_direct or page_unified (mla_page_view)
    @property
    def page_size(self) -> int: ...
    @property
    def layer_num(self) -> int: ...
    @property
    def kv_lora_rank(self) -> int: ...
    @property
    def qk_rope_head_dim(self) -> int: ...
    @property
    def kv_cache_dim(self) -> int: ...  # kv_lora_rank + qk_rope_head_dim unless packed
    @property
    def dtype(self) -> torch.dtype: ...


def mla_page_view(kv_buffer: torch.Tensor, layout: str, index: int, page_size: int) -> torch.Tensor:
    """An MLA host pool's page starting at token `index` as a [layers, 1, page, 1, latent] view (no copy)."""
    if layout == "layer_first":  # [layers, tokens, 1, latent]
        return kv_buffer[:, index:index + page_size].unsqueeze(1)
    if layout == "page_first":  # [tokens, layers, 1, latent]
        return kv_buffer[index:index + page_size].transpose(0, 1).unsqueeze(1)
    page = index // page_size
    if layout == "page_first_direct":  # [pages, layers, page, 1, latent]
        return kv_buffer[page].unsqueeze(1)
    if layout == "page_unified":  # [pages, layers, page, latent]
        return kv_buffer[page].unsqueeze(1).unsqueeze(3)
    raise ConfigError(f"SGLang MLA host pool layout {layout!r} is not supported by the kvstore backend; "
                      "use layer_first, page_first, page_first_direct or page_unified")


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

    mem_pool_host: HostPool | MLAHostPool  # set by HiCacheStorage.register_mem_pool_host

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict[str, object] | None = None) -> None:
        if storage_config.is_mla_model and max(storage_config.dcp_size, storage_config.attn_cp_size) > 1:
            raise ConfigError(f"context parallelism (dcp_size={storage_config.dcp_size}, attn_cp_size="
                              f"{storage_config.attn_cp_size}) splits each MLA page by token across ranks, and the "
                              "kvstore HiCache backend stores whole latent pages: run SGLang with context parallel size 1")
        self.options = StoreOptions.from_mapping(storage_config.extra_config or {}, ignore=_SGLANG_KEYS)
        self._config = storage_config
        kind = AttentionKind.MLA if storage_config.is_mla_model else AttentionKind.MHA
        self.role: ShardRole = shard_role(kind, int(storage_config.tp_size), int(storage_config.tp_rank))
        self._view = mla_page_view if storage_config.is_mla_model else page_view
        self._root = b""
        self.store: EngineStore | None = None
        self.counters = {"get_hits": 0, "get_misses": 0, "set_pages": 0, "set_failed": 0}

    def register_mem_pool_host(self, mem_pool_host: HostPool | MLAHostPool) -> None:
        """Learn the page geometry from SGLang's host pool and open the store with that layout."""
        super().register_mem_pool_host(mem_pool_host)
        self.layout = _mla_layout(mem_pool_host) if self._config.is_mla_model else _mha_layout(mem_pool_host)  # type: ignore[arg-type]
        self._view(mem_pool_host.kv_buffer, mem_pool_host.layout, 0, mem_pool_host.page_size)  # refuses others now
        if self.store is not None:
            self.store.close()
        self.store = open_store(self.options, self.layout, "sglang-hicache",
                                  model=self.options.model_id or str(self._config.model_name))
        cfg = self._config
        identity = ModelIdentity(model=self.options.model_id or str(cfg.model_name), kv_dtype=self.layout.dtype,
                                 layout_fingerprint=self.layout.fingerprint, tp_size=self.role.key_tp_size,
                                 pp_size=int(cfg.pp_size), engine="sglang")
        self._root = identity.scope().root(self.store.root_key)  # SGLang's page hash carries its own extra keys

    def _store(self) -> EngineStore:
        if self.store is None:
            raise ConfigError("the kvstore backend has no host pool yet: SGLang calls register_mem_pool_host first")
        return self.store

    def _keys(self, keys: list[str]) -> list[bytes]:
        return shard_keys([named_key(self._root, k) for k in keys], self.role.key_tp_rank, int(self._config.pp_rank))

    def _pages(self, host_indices: torch.Tensor, count: int) -> list[torch.Tensor]:
        pool, size = self.mem_pool_host, self.layout.chunk_tokens
        if len(host_indices) != count * size:
            raise ConfigError(f"{count} pages need {count * size} host indices, got {len(host_indices)}")
        starts = host_indices[::size].tolist()
        return [self._view(pool.kv_buffer, pool.layout, int(i), size) for i in starts]

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
        each page queued (SGLang may reuse its memory now), False for those the full queue dropped. On an MLA
        model's TP rank > 0 nothing is stored: rank 0 stores the same latents."""
        pages = self._pages(host_indices, len(keys))
        if not self.role.writes:
            return [True] * len(keys)
        return self._save(self._keys(keys), pages)

    def _save(self, keys: list[bytes], pages: Sequence[torch.Tensor]) -> list[bool]:
        store = self._store()
        queued = store.save_async(keys, [owned_buffer(store, page) for page in pages])
        self.counters["set_pages"] += queued
        self.counters["set_failed"] += len(keys) - queued
        return [i < queued for i in range(len(keys))]

    # ----- legacy interface (flat pages [2, layers, page, heads, dim]; MLA [layers, page, 1, latent]) -----
    def _flat_view(self, flat: torch.Tensor) -> torch.Tensor:
        """A flat legacy page seen as a kvstore chunk (a view)."""
        lay = self.layout
        if lay.kind is AttentionKind.MLA:
            return flat.view(lay.num_layers, lay.chunk_tokens, 1, lay.head_dim).unsqueeze(1)
        return flat.view(2, lay.num_layers, lay.chunk_tokens, lay.num_kv_heads, lay.head_dim).transpose(0, 1)

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
                self._flat_view(flat).copy_(chunk)
            result.append(flat if hit else None)
        return result

    def set(self, key: str, value: torch.Tensor, target_location: object = None,
            target_sizes: object = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Sequence[torch.Tensor] | None = None, target_locations: object = None,
                  target_sizes: object = None) -> bool:
        if not self.role.writes:
            return True
        return all(self._save(self._keys(keys), [self._flat_view(v) for v in values or []]))

    def exists(self, key: str) -> bool:
        return self._store().lookup_keys(self._keys([key])) == 1

    def get_stats(self) -> dict[str, int]:
        return dict(self.counters)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None


def _mha_layout(pool: HostPool) -> KVLayout:
    if pool.head_dim != pool.v_head_dim:
        raise ConfigError(f"K width {pool.head_dim} != V width {pool.v_head_dim}: kvstore chunks need equal widths")
    return KVLayout(num_layers=pool.layer_num, num_kv_heads=pool.head_num, head_dim=pool.head_dim,
                    dtype=str(pool.dtype).removeprefix("torch."), chunk_tokens=pool.page_size)


def _mla_layout(pool: MLAHostPool) -> KVLayout:
    """kvstore's MLA layout for SGLang's MLA host pool; packed rows (fp8 DSA: latent, rope and scales in one row)
    are refused."""
    latent = pool.kv_lora_rank + pool.qk_rope_head_dim
    if pool.kv_cache_dim != latent:
        raise ConfigError(f"SGLang's MLA host pool packs {pool.kv_cache_dim} values a token (kv_lora_rank "
                          f"{pool.kv_lora_rank} + rope {pool.qk_rope_head_dim} = {latent} unpacked), and the kvstore "
                          "backend stores unpacked latents: run without a packed (fp8) DSA KV cache")
    return KVLayout(num_layers=pool.layer_num, num_kv_heads=1, head_dim=latent,
                    dtype=str(pool.dtype).removeprefix("torch."), chunk_tokens=pool.page_size, kind=AttentionKind.MLA)
