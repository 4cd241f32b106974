"""`KVStoreRemoteConnector`: LMCache's remote storage plugin over kvstore (LMCache 0.5.6 `RemoteConnector`).

LMCache config (YAML, or LMCACHE_* env)::

    chunk_size: 256                       # a daemon with a [layout]: its chunk_tokens; with none: any
    save_unfull_chunk: false              # kvstore stores whole chunks only
    remote_serde: naive
    remote_storage_plugins: [kvstore]
    extra_config:
      remote_storage_plugin.kvstore.module_path: connector.lmcache.plugin
      remote_storage_plugin.kvstore.class_name: KVStoreRemoteConnector
      remote_storage_plugin.kvstore.url: http://127.0.0.1:8765
      remote_storage_plugin.kvstore.token: ...            # optional
      remote_storage_plugin.kvstore.lookup_timeout_s: 0.5  # optional deadlines (connector/deadlines.py)
    pre_caching_hash_algorithm: sha256_cbor   # or PYTHONHASHSEED=0 in every process: see below

LMCache names a chunk by a prefix hash that, with its default `builtin` (and the xxhash) algorithms,
differs per process unless PYTHONHASHSEED is set: a reader in another process would then never hit.
The plugin refuses to start in that case, with one line saying what to set.

LMCache's chunk keys already chain the prefix (each chunk_hash covers all tokens before it), so a
key maps to one kvstore key and LMCache's "how many leading chunks are there" is kvstore's prefix
lookup (`lookup_keys`). Chunks are stored in kvstore's canonical layout [layers, 2, tokens, heads,
dim], so the vLLM connector and this plugin read each other's chunks' bytes the same way; LMCache's
buffer is [2, layers, tokens, heads*dim] (KV_2LTD), one transposing copy apart. For MLA (one plane)
the two layouts are the same bytes and a get lands in LMCache's buffer with no extra copy. A put copies
each chunk into a buffer of its own and queues it on the store's bounded save queue
(connector/engine_store.py), so lookups and gets on the plugin's I/O thread never wait behind a save.

LMCache 0.5.6 swallows any exception raised while creating a remote backend and then misses
silently forever. So creation here logs at ERROR and raises `IrrecoverableException`, and
`require_remote(engine)` (call it after building the engine) raises unless the plugin is connected:
the liveness check the integration tests assert.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.exceptions import IrrecoverableException
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from connector.engine_store import EngineStore
from connector.plugin_store import StoreOptions, load_buffer, open_store, owned_buffer
from kvstore.errors import ConfigError, KVStoreError
from kvstore.kv_scope import ModelIdentity, named_key
from kvstore.layout import AttentionKind, KVLayout

logger = logging.getLogger(__name__)
PLUGIN_NAME = "kvstore"
_LIVE: weakref.WeakSet[KVStoreRemoteConnector] = weakref.WeakSet()
_STABLE_HASHES = ("sha256", "sha256_cbor", "sha256_cbor_64bit")


def check_stable_hash(algorithm: str, environ: Mapping[str, str] = os.environ) -> None:
    """Raise unless LMCache's prefix hash names a chunk the same in every process (else no reader in another
    process or after a restart would ever hit)."""
    seed = environ.get("PYTHONHASHSEED", "")
    if algorithm in _STABLE_HASHES or seed.isdigit():
        return
    raise ConfigError(f"LMCache's prefix hash ({algorithm!r}) differs per process unless PYTHONHASHSEED is set, so "
                      "chunks stored by one process never hit in another: set PYTHONHASHSEED=0 for every LMCache "
                      "process, or pre_caching_hash_algorithm: sha256_cbor in LMCache's config")


def layout_from_metadata(metadata: Any, *, mla: bool) -> KVLayout:
    """kvstore's layout for LMCache's metadata (kv_shape = (layers, 2, chunk_size, kv_heads, head_dim))."""
    layers, _, chunk_tokens, heads, dim = metadata.kv_shape
    dtype = str(metadata.kv_dtype).removeprefix("torch.")
    kind = AttentionKind.MLA if mla else AttentionKind.MHA
    return KVLayout(num_layers=layers, num_kv_heads=1 if mla else heads, head_dim=dim, dtype=dtype,
                    chunk_tokens=chunk_tokens, kind=kind)


class KVStoreRemoteConnector(RemoteConnector):
    """LMCache `RemoteConnector` on a kvstore daemon (or an embedded store when no url is given)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any, config: Any,
                 plugin_name: str | None = None) -> None:
        metadata = local_cpu_backend.metadata
        try:
            if metadata is None:
                raise ConfigError("LMCache gave the kvstore plugin no metadata (scheduler role?); "
                                  "it runs in LMCache's worker role")
            super().__init__(local_cpu_backend.config, metadata)
            self.loop = loop
            self.local_cpu_backend = local_cpu_backend
            self.layout = layout_from_metadata(metadata, mla=bool(metadata.use_mla))
            self._check_config(config)
            prefix = f"remote_storage_plugin.{plugin_name or PLUGIN_NAME}."
            options = StoreOptions.from_mapping(config.extra_config or {}, prefix=prefix,
                                                ignore=("module_path", "class_name"))
            if not options.url and not options.config and not options.root_dir:
                raise ConfigError(f"set {prefix}url (the `kvstore serve` address) in LMCache's extra_config")
            self.store: EngineStore = open_store(options, self.layout, "lmcache-plugin",
                                                          model=options.model_id or str(metadata.model_name))
        except Exception as exc:
            logger.error("kvstore LMCache plugin cannot start: %s", exc)
            raise IrrecoverableException(f"kvstore LMCache plugin cannot start: {exc}") from exc
        identity = ModelIdentity(model=options.model_id or str(metadata.model_name), kv_dtype=self.layout.dtype,
                                 layout_fingerprint=self.layout.fingerprint, tp_size=int(metadata.world_size),
                                 engine="lmcache")
        self._root = identity.scope().root(self.store.root_key)  # LMCache's key names the worker and chunk
        self._io = ThreadPoolExecutor(1, thread_name_prefix="kvstore-lmcache")  # store calls in order, off the loop
        self.counters = {"get_hits": 0, "get_misses": 0, "put_chunks": 0, "put_failed": 0}
        _LIVE.add(self)
        logger.info("kvstore LMCache plugin connected (%s)", self.layout)

    def _check_config(self, config: Any) -> None:
        check_stable_hash(str(config.pre_caching_hash_algorithm))
        if config.save_unfull_chunk:
            raise ConfigError("kvstore stores whole chunks only: set save_unfull_chunk: false in LMCache's config")
        if config.use_layerwise:
            raise ConfigError("the kvstore plugin stores whole chunks, not layerwise objects: set use_layerwise: false")

    # ----- keys and shapes ------------------------------------------------------------------
    def _key(self, key: CacheEngineKey) -> bytes:
        return named_key(self._root, key.to_string())

    def _chunk_view(self, memory_obj: MemoryObj) -> torch.Tensor:
        """LMCache's [planes, layers, tokens, heads*dim] buffer seen in kvstore's order (a view, not a copy)."""
        tensor = memory_obj.tensor
        assert tensor is not None
        layout = self.layout
        return tensor.view(layout.num_planes, layout.num_layers, layout.chunk_tokens, layout.num_kv_heads,
                           layout.head_dim).transpose(0, 1)

    def _allocate(self) -> MemoryObj | None:
        return self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)

    # ----- sync work (on the plugin's I/O thread) --------------------------------------------
    def _contains(self, keys: list[CacheEngineKey]) -> int:
        return self.store.lookup_keys([self._key(k) for k in keys])

    def _get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        objs = [self._allocate() for _ in keys]
        wanted = [i for i, obj in enumerate(objs) if obj is not None]
        views = [self._chunk_view(objs[i]) for i in wanted]  # type: ignore[arg-type]
        direct = [v.is_contiguous() for v in views]
        outs = [v if ok else load_buffer(self.store) for v, ok in zip(views, direct)]  # pooled: one copy in
        answer = self.store.get_guarded([self._key(keys[i]) for i in wanted], outs)
        result: list[MemoryObj | None] = [None] * len(keys)
        if answer.pending is not None:  # past the deadline: the late call still writes into LMCache's buffers
            late = [objs[i] for i in wanted]
            answer.pending.add_done_callback(lambda _: [obj.ref_count_down() for obj in late])  # type: ignore[union-attr]
            self.counters["get_misses"] += len(keys)
            return result
        found = answer.value
        for i, view, out, ok, hit in zip(wanted, views, outs, direct, found, strict=True):
            obj = objs[i]
            assert obj is not None
            if not hit:
                obj.ref_count_down()
                continue
            if not ok:
                view.copy_(out)
            result[i] = obj
        self.counters["get_hits"] += sum(r is not None for r in result)
        self.counters["get_misses"] += sum(r is None for r in result)
        return result

    def _put(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        """Copy the chunks out of LMCache's buffers (LMCache frees them when this returns) and queue them on the
        store's bounded save queue: a save never holds the I/O thread, so a lookup or a get is never behind one."""
        full = [(k, o) for k, o in zip(keys, memory_objs, strict=True) if o.get_shapes() == self.meta_shapes]
        if len(full) != len(keys):
            logger.warning("kvstore plugin: %d partial chunks not stored (set save_unfull_chunk: false)",
                           len(keys) - len(full))
        chunks = [owned_buffer(self.store, self._chunk_view(o)) for _, o in full]  # pooled: the daemon reads the slot
        queued = self.store.save_async([self._key(k) for k, _ in full], chunks)
        self.counters["put_chunks"] += queued
        self.counters["put_failed"] += len(full) - queued

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    # ----- RemoteConnector -------------------------------------------------------------------
    async def exists(self, key: CacheEngineKey) -> bool:
        return bool(await self._run(self._contains, [key]))

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self._io.submit(self._contains, [key]).result() == 1

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        """Leading chunks held: kvstore's prefix lookup."""
        return int(self._io.submit(self._contains, list(keys)).result())

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False) -> int:
        return int(await self._run(self._contains, list(keys)))

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        return (await self._run(self._get, [key]))[0]  # type: ignore[no-any-return]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        return await self._run(self._get, list(keys))  # type: ignore[no-any-return]

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self._run(self._put, [key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        await self._run(self._put, list(keys), list(memory_objs))

    async def list(self) -> list[str]:
        """kvstore keys are hashes of LMCache's keys; the names cannot be listed back."""
        return []

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """LMCache's health check, off the I/O thread: a ping to a stalled store never holds a lookup behind it."""
        return 0 if await asyncio.to_thread(self.is_alive) else 1

    def is_alive(self) -> bool:
        """True when the store answers now (the daemon's /v1/stats, or the embedded store)."""
        try:
            self.store.stats()
        except (KVStoreError, OSError) as exc:  # DaemonUnreachable is a KVStoreError
            logger.warning("kvstore plugin: store not answering (%s)", exc)
            return False
        return True

    async def close(self) -> None:
        self._io.shutdown(wait=True)
        self.store.close()
        _LIVE.discard(self)


def live_connectors() -> list[KVStoreRemoteConnector]:
    """The plugin instances created in this process and not closed."""
    return list(_LIVE)


def require_remote(engine: Any, plugin_name: str = PLUGIN_NAME, timeout_s: float = 10.0) -> None:
    """Raise unless LMCache `engine` has the kvstore remote backend and it answers a ping now.

    LMCache drops a remote backend whose creation failed (it only logs); call this once after
    building the engine so that such a start fails instead of missing forever.
    """
    backends = engine.storage_manager.storage_backends
    backend = backends.get(f"RemoteBackend-{plugin_name}")
    if backend is None:
        raise KVStoreError(f"LMCache has no 'RemoteBackend-{plugin_name}' (it has {sorted(backends)}); "
                           "its creation failed: see the ERROR line from connector.lmcache.plugin in the log")
    if backend.connection is None:
        raise KVStoreError(f"LMCache's {plugin_name} backend has no connection (creation failed or lost)")
    code = asyncio.run_coroutine_threadsafe(backend.connection.ping(), backend.loop).result(timeout_s)
    if code != 0:
        raise KVStoreError(f"LMCache's {plugin_name} backend is connected but its kvstore store does not answer")
