"""`TieredStore`: KV chunks across tiers, fastest first, with replication, eviction and recovery.

    put ──> top level (sync copy) ──queue──> writer threads ──> every replica level (NVMe, PFS)
    get <── fastest level holding it;  disk-only chunks: ReplicatedRead over all replicas,
            then promoted into the top level
    full level: victims from its eviction policy; a victim with no copy below is demoted first
    layouts: chunks of every registered layout share the levels (kvstore/store/layouts.py); a chunk is
            read only into a buffer of the layout it was stored with

The index (`ChunkIndex`, kvstore/store/index.py) owns the lock, the entries and the pins and
states the locking rules; no I/O happens under its lock. Chunks being read or still needed as a
write source are pinned and never chosen as victims.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch

from kvstore.capacity_caps import CapacityCap, apply_caps
from kvstore.config import StoreConfig
from kvstore.errors import KVStoreError, LayoutMismatchError
from kvstore.hashing import ChunkKey, Namespace, TokenIds, chunk_keys, iter_chunk_keys, validate_key
from kvstore.kv_scope import KeyScope
from kvstore.layout import KVLayout
from kvstore.stats import Counters
from kvstore.store.events import StoreEvents
from kvstore.store.host_batch import HostBatch, raw_host_arena
from kvstore.store.index import ChunkIndex
from kvstore.store.layouts import LayoutSet
from kvstore.store.levels import Level, build_compression, build_level
from kvstore.store.memory_model import store_memory
from kvstore.store.mover import Mover
from kvstore.store.reads import read_from_disks
from kvstore.store.recovery import evict_to_capacity, rebuild_index
from kvstore.store.removal import remove_everywhere
from kvstore.store.write_errors import WriteErrors
from kvstore.types import ChunkStore, PutResult, StoreEvent, TierKind
from policies.eviction import AccessInfo
from tiers.file_io import aligned_empty

logger = logging.getLogger(__name__)
TIER_COUNTERS = ("hits", "puts", "bytes_read", "bytes_written", "evictions", "demotions", "dropped", "promotions",
                 "corrupt", "read_errors", "not_replicated", "lost_on_eviction", "stored_raw_encoders_busy")


class TieredStore:
    """The store. Thread-safe; use as a context manager or call `close()` to drain writes."""

    def __init__(self, config: StoreConfig, *, caps: Sequence[CapacityCap] = ()) -> None:
        """`caps`: tiers that start below their configured capacity (kvstore.preflight.check_machine's answer);
        what a capped disk tier holds beyond its effective capacity is evicted before the store serves."""
        self.configured_capacity = {**{t.kind: t.capacity_bytes for t in config.tiers},
                                    **{cap.kind: cap.configured_bytes for cap in caps}}
        config = apply_caps(config, caps)
        self.config = config
        self.layout = config.layout  # the configured layout (with any_layout: the default for unregistered clients)
        disk = next((t.path for t in config.tiers if t.kind in (TierKind.NVME, TierKind.PFS) and t.path), None)
        self.layouts = LayoutSet(config.layout, fixed=not config.any_layout, folder=disk)
        self.namespace = Namespace(model_id=config.model_id, layout_fingerprint=self.layout.fingerprint,
                                   tenant_salt=config.tenant_salt)
        self.root_key = self.namespace.root_key
        self.stats_counters = Counters()
        self.events = StoreEvents(self.stats_counters, self.holds)
        self.compression = build_compression(config)
        self.levels: list[Level] = [build_level(i, t, self.layout, self.compression, self.stats_counters)
                                   for i, t in enumerate(config.tiers)]
        self.index = ChunkIndex(self.levels)
        num_disk = sum(not lv.tier.is_memory for lv in self.levels)
        self._read_pool = ThreadPoolExecutor(max(1, num_disk * config.readers_per_tier), thread_name_prefix="kv-read")
        self.write_errors = WriteErrors()  # the Mover's writers note failures here, by cause
        self.mover = Mover(self.levels, self.layouts, config, self.index, self.stats_counters, self.emit,
                           self.write_errors)
        arena = raw_host_arena(self.levels[0])
        self._host_batch = None if arena is None else HostBatch(self.levels[0], arena, self.index, self.mover,
                                                                self.stats_counters)
        rebuild_index(self.levels, self.layouts, self.index, self.stats_counters)
        evict_to_capacity(self.levels, self.index, self.mover)
        self.mover.start_writers()
        if self.layouts.is_open:
            logger.info("store serves every layout its clients register (%d known now)", len(self.layouts))
        logger.info("store ready: %s; %d chunks indexed", ", ".join(f"{lv.name} {lv.config.capacity_bytes >> 20} MiB"
                                                                     for lv in self.levels), len(self.index))

    def register_layout(self, layout: KVLayout) -> KVLayout:
        """Serve chunks of `layout` too (a store with `any_layout`); a fixed store accepts only its own.

        Raises:
            LayoutMismatchError: the store is fixed to another layout.
        """
        return self.layouts.register(layout)

    # ----- keys and lookup -----------------------------------------------------------------
    def chunk_keys(self, token_ids: TokenIds, scope: KeyScope | None = None) -> list[ChunkKey]:
        """Keys of the full chunks of a prompt, in prefix order; under `scope` (model, adapter, salt) if given."""
        root = self.root_key if scope is None else scope.root(self.root_key)
        return chunk_keys(token_ids, root, self.layout.chunk_tokens)

    def lookup(self, token_ids: TokenIds, scope: KeyScope | None = None) -> int:
        """Number of leading tokens whose KV is held in some tier (a multiple of chunk_tokens)."""
        root = self.root_key if scope is None else scope.root(self.root_key)
        return self.lookup_keys(iter_chunk_keys(token_ids, root, self.layout.chunk_tokens)) * self.layout.chunk_tokens

    def lookup_keys(self, keys: Iterable[ChunkKey]) -> int:
        """Number of leading keys held, walking until the first miss."""
        hits = 0
        holds = self.index.holds
        for key in keys:
            if holds(key) or self._discover(key):
                hits += 1
            else:
                break
        self.stats_counters.incr("lookups")
        self.stats_counters.incr("lookup_hit_chunks", hits)
        return hits

    def _discover(self, key: ChunkKey) -> bool:
        """A chunk another node or process wrote to a shared level (PFS, Redis) is a hit too."""
        for level in self.levels:
            if not level.tier.is_shared:
                continue
            try:
                meta = level.tier.meta(key)
            except KVStoreError:  # e.g. Redis down: a miss, never an error
                continue
            if meta is not None and (self.layouts.is_open or meta.layout_fingerprint == self.layout.fingerprint):
                self.index.add_location(level, key, meta, AccessInfo(size_bytes=meta.stored_bytes))
                self.stats_counters.incr(f"{level.name}.discovered")
                return True
        return False

    def contains(self, key: ChunkKey) -> bool:
        return validate_key(key) in self.index or self._discover(key)

    def empty_chunk(self) -> torch.Tensor:
        """An uninitialised chunk buffer, 4 KiB aligned so disk tiers read straight into it
        (O_DIRECT) without a staging copy. Use it for load buffers."""
        raw = aligned_empty(self.layout.chunk_bytes)
        return raw.view(self.layout.torch_dtype).view(self.layout.chunk_shape)

    # ----- put -----------------------------------------------------------------------------
    def put(self, key: ChunkKey, chunk: torch.Tensor) -> PutResult:
        return self.put_many([key], [chunk])

    def put_many(self, keys: Sequence[ChunkKey], chunks: Sequence[torch.Tensor], *, start_position: int = 0,
                 root: ChunkKey | None = None) -> PutResult:
        """Store chunks (each the chunk shape and dtype of a registered layout, any device) under their keys.

        `keys` are consecutive chunks of one prompt starting at chunk `start_position`; `root` is
        the prompt's first chunk key (known when start_position is 0), a hint for the policies.
        Validates every chunk before storing any. Waits up to `put_timeout_s` for room and queue
        space; what could not be stored or replicated in that time is named in the result.
        Chunks are inserted tail first (as `kvstore replay` does), so within a chain the head is the
        most recent: a tier too small for the whole chain keeps its head, which is what a prefix
        lookup needs.

        Raises:
            LayoutMismatchError: a chunk has the wrong shape or dtype.
            BadChunkError: a key is not 16 bytes.
        """
        if len(keys) != len(chunks):
            raise LayoutMismatchError(f"put_many got {len(keys)} keys but {len(chunks)} chunks")
        keys = [validate_key(k) for k in keys]
        typed = [self._raw_bytes(chunk) for chunk in chunks]
        raws = [raw for raw, _ in typed]
        infos = self._chain_infos(keys, [raw.numel() for raw in raws], start_position, root, request_hit=False)
        result = PutResult()
        deadline = time.monotonic() + self.config.put_timeout_s
        batch = self._host_batch
        reserved: AbstractContextManager[dict[int, int]] = nullcontext({})
        if batch is not None and batch.can_put(raws):  # every slot reserved and filled in one copy first
            reserved = batch.reserved(keys, raws, deadline, result)
        with reserved as slots:
            for i in range(len(keys) - 1, -1, -1):
                if batch is not None and i in slots:
                    batch.commit(keys[i], slots.pop(i), infos[i], deadline, result, typed[i][1])
                elif keys[i] not in result.not_stored:
                    self._put_one(keys[i], typed[i], infos[i], deadline, result)
        result.stored = [key for key in keys if key not in result.not_stored]
        if result.not_stored:
            logger.warning("put: %d of %d chunks not stored (first reason: %s)", len(result.not_stored), len(keys),
                           next(iter(result.not_stored.values())))
        return result

    def _put_one(self, key: ChunkKey, typed: tuple[torch.Tensor, KVLayout], info: AccessInfo, deadline: float,
                 result: PutResult) -> None:
        if self._touch_existing(key, info):
            return
        try:
            self.mover.put_top(key, typed[0], info, deadline, typed[1])
        except KVStoreError as exc:
            result.not_stored[key] = str(exc)
            self.stats_counters.incr("not_stored")
            return
        self.stats_counters.incr("puts")
        self.mover.enqueue_replicas(key, info, deadline, result)

    def _chain_infos(self, keys: list[ChunkKey], sizes: list[int], start_position: int, root: ChunkKey | None, *,
                     request_hit: bool) -> list[AccessInfo]:
        root = root if root is not None else (keys[0] if keys and start_position == 0 else None)
        num = start_position + len(keys)
        return [AccessInfo(size_bytes=sizes[i], position=start_position + i,
                           parent=keys[i - 1] if i else None, request_hit=request_hit, root=root, chain_chunks=num)
                for i in range(len(keys))]

    def _raw_bytes(self, chunk: torch.Tensor) -> tuple[torch.Tensor, KVLayout]:
        """The chunk's bytes and the registered layout its shape and dtype name (LayoutMismatchError if none)."""
        if not isinstance(chunk, torch.Tensor):
            raise LayoutMismatchError(f"a chunk must be a torch.Tensor, got {type(chunk).__name__}")
        layout = self.layouts.of_chunk(chunk)
        return chunk.contiguous().view(torch.uint8).reshape(-1), layout

    def _touch_existing(self, key: ChunkKey, info: AccessInfo) -> bool:
        """A put of a chunk already held: an access, plus copies for replica tiers that now admit it."""
        missing = self.index.touch_existing(key, info, self.mover.replica_levels)
        if missing is None:
            return False
        self.stats_counters.incr("dedup_puts")
        if missing:  # e.g. a second-hit admission that declined the first time
            self.mover.enqueue_replicas(key, info, time.monotonic(), PutResult(), levels=missing)
        return True

    # ----- get -----------------------------------------------------------------------------
    def get(self, key: ChunkKey, out: torch.Tensor) -> bool:
        return self.get_many([key], [out])[0]

    def get_many(self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        """Fill each `out` (a registered layout's chunk shape and dtype, any device) from the fastest tier.

        Returns one bool per key; False is a miss (absent, evicted meanwhile, corrupt, I/O error, or stored
        under another layout than the out's).
        """
        return [tier is not None for tier in self.get_many_served(keys, outs)]

    def get_many_served(self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor]) -> list[TierKind | None]:
        """`get_many` that says which tier served each chunk (None: a miss), for per-tier hit counts."""
        if len(keys) != len(outs):
            raise LayoutMismatchError(f"get_many got {len(keys)} keys but {len(outs)} output buffers")
        keys = [validate_key(k) for k in keys]
        typed = [self._raw_bytes(out) if out.is_contiguous() else self._bad_out(out) for out in outs]
        out_bytes, layouts = [raw for raw, _ in typed], [layout for _, layout in typed]
        served: list[int | None] = [None] * len(keys)
        plan = self.index.plan_reads(keys)
        try:
            self._read_memory(keys, out_bytes, layouts, plan.memory_jobs, served)
            if plan.disk_jobs:
                read_from_disks(self.index, self.mover, self._read_pool, self.config.readers_per_tier,
                                keys, out_bytes, layouts, plan.disk_jobs, served)
        finally:
            self.index.unpin(plan.pinned)
        self._record_hits(keys, [raw.numel() for raw in out_bytes], [level is not None for level in served])
        return [None if level is None else self.levels[level].kind for level in served]

    def _read_memory(self, keys: list[ChunkKey], out_bytes: list[torch.Tensor], layouts: list[KVLayout],
                     jobs: list[tuple[int, int]], served: list[int | None]) -> None:
        """The chunks held in memory: those in a raw host top level for CPU outs in one batched copy."""
        batched = [i for i, level_index in jobs if level_index == 0 and out_bytes[i].device.type == "cpu"]
        if self._host_batch is not None and len(batched) > 1:
            for i, hit in zip(batched, self._host_batch.read(keys, out_bytes, layouts, batched), strict=True):
                served[i] = 0 if hit else None
            done = set(batched)
            jobs = [job for job in jobs if job[0] not in done]
        for i, level_index in jobs:
            served[i] = level_index if self.mover.read_level(level_index, keys[i], out_bytes[i], layouts[i]) else None

    def _bad_out(self, out: torch.Tensor) -> tuple[torch.Tensor, KVLayout]:
        raise LayoutMismatchError(f"output buffers must be contiguous, got strides {out.stride()}; use torch.empty(layout.chunk_shape)")

    def _record_hits(self, keys: list[ChunkKey], sizes: list[int], results: list[bool]) -> None:
        hits = sum(results)
        self.stats_counters.incr("get_hits", hits)
        self.stats_counters.incr("get_misses", len(keys) - hits)
        self._touch_chain(keys, sizes, results, request_hit=bool(results and results[0]))

    def _touch_chain(self, keys: list[ChunkKey], sizes: list[int], touched: list[bool], *, request_hit: bool) -> None:
        """Tell each level's policy about an access to a chain, tail before head, so the head of a
        chain ends most recent and a chain loses its tail first."""
        self.index.touch(keys, self._chain_infos(keys, sizes, 0, None, request_hit=request_hit), touched)

    @property
    def host_shm_name(self) -> str | None:
        """The host tier's arena in /dev/shm (`options.shm_name`), or None."""
        arena = raw_host_arena(self.levels[0]) if self.levels else None
        return arena.shm_name if arena is not None else None

    # ----- events -------------------------------------------------------------------------------
    def add_listener(self, listener: Callable[[StoreEvent], None]) -> None:
        """Call `listener` (from the thread that made the change, outside the index lock) for every
        chunk stored in or removed from a tier. It must be fast and never block: queue and batch."""
        self.events.add_listener(listener)

    def add_drop_listener(self, listener: Callable[[ChunkKey], None]) -> None:
        """Call `listener(key)` after a chunk has left the index (evicted or demoted out of its last
        tier, dropped as corrupt or vanished, removed), from the thread that dropped it, outside the
        index lock. It may be called again for a key already gone; check `holds(key)` when in doubt."""
        self.events.add_drop_listener(listener)

    def holds(self, key: ChunkKey) -> bool:
        """Whether the index holds `key` now (no shared-tier probe, unlike `contains`)."""
        return self.index.holds(key)

    def raw_bytes_of(self, key: ChunkKey) -> int | None:
        """The raw size of a held chunk (its layout's chunk bytes), None when not held."""
        for level_index in self.index.levels_of(key):
            meta = self.index.meta(key, level_index)[1]
            if meta is not None:
                return meta.raw_bytes
        return None

    def resident_keys(self) -> list[tuple[ChunkKey, list[TierKind]]]:
        """Every indexed chunk and the tiers holding it (a snapshot, e.g. to resync a cluster index)."""
        return [(key, [self.levels[i].kind for i in where]) for key, where in self.index.snapshot()]

    def emit(self, kind: str, key: ChunkKey, tier: TierKind) -> None:
        self.events.emit(kind, key, tier)

    # ----- pins ----------------------------------------------------------------------------------
    def pin(self, keys: Iterable[ChunkKey]) -> int:
        """Protect chunks from eviction (e.g. between a scheduler's lookup and the worker's load).

        Returns how many of the keys were present and are now pinned; the caller must `unpin`
        exactly those keys (the leading run, when called with a lookup's keys).
        """
        return self.index.pin_prefix(keys)

    def unpin(self, keys: Iterable[ChunkKey]) -> None:
        self.index.unpin(keys)

    # ----- removal, maintenance ------------------------------------------------------------
    def remove(self, key: ChunkKey) -> bool:
        """Delete a chunk from every tier (`removal.remove_everywhere`: a tier that fails keeps its copy in the
        index, and the error is raised after the other tiers are done)."""
        return remove_everywhere(self.levels, self.index, validate_key(key), self.emit)

    def drop_tier_copies(self, kind: TierKind) -> int:
        """Drop every copy held in one tier (demoting chunks with no copy below). Returns the count."""
        self.flush()
        level = next(lv for lv in self.levels if lv.kind is kind)
        dropped = 0
        for key, _ in list(level.tier.keys()):
            if self.mover.evict(level, key, reason="drop"):
                dropped += 1
        return dropped

    def wait_durable(self, keys: Iterable[ChunkKey], timeout_s: float) -> list[ChunkKey]:
        """Wait until each key's queued lower-tier writes are done (without waiting for other
        clients' writes, unlike `flush`). Returns the keys that are still not on any disk tier."""
        keys = list(keys)
        self.index.wait_written(keys, timeout_s)
        return [k for k in keys if not self._on_disk(k)]

    def _on_disk(self, key: ChunkKey) -> bool:
        return any(self.levels[i].tier.is_durable for i in self.index.levels_of(key))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued lower-tier write has finished. True when drained."""
        return self.mover.flush(timeout_s)

    def stats(self) -> dict[str, Any]:
        counters = self.stats_counters.snapshot()
        tiers = {}
        for level in self.levels:
            tiers[level.name] = {
                "used_bytes": level.tier.used_bytes,
                "capacity_bytes": level.tier.capacity_bytes,
                "configured_capacity_bytes": self.configured_capacity[level.kind],
                "chunks": len(level.eviction),
                "queue_depth": level.queue.qsize() if level.queue is not None else 0,
                **dict.fromkeys(TIER_COUNTERS, 0),
                **{k.split(".", 1)[1]: v for k, v in counters.items() if k.startswith(level.name + ".")},
            }
        top = {**dict.fromkeys(("puts", "dedup_puts", "not_stored", "get_hits", "get_misses", "lookups"), 0),
               **{k: v for k, v in counters.items() if "." not in k}}
        return {"chunks": len(self.index), "tiers": tiers, **top, "memory": store_memory(self.levels, len(self.index))}

    def close(self) -> None:
        self.mover.stop()
        self._read_pool.shutdown(wait=True)
        for level in self.levels:
            level.tier.close()

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if TYPE_CHECKING:
    def _is_a_chunk_store(store: TieredStore) -> ChunkStore:  # mypy checks the contract
        return store
