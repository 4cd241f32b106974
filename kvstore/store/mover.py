"""`Mover`: every byte movement of the TieredStore (put, replicate, promote, evict, demote).

Kept apart from the store's API so each stays small. Reads and changes the index only through
`ChunkIndex` methods (kvstore/store/index.py states the locking rules); all copies and I/O run
outside the index lock.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from kvstore.errors import CorruptChunkError, KVStoreError, TierFullError
from kvstore.store.entry import Entry, Queued
from kvstore.store.index import ChunkIndex
from kvstore.store.levels import CODEC_NONE, Level, StagingBuffers, decode_into, open_decoder
from kvstore.store.pressure import plan_relief, relieve
from kvstore.types import ChunkMeta, PutResult
from policies.eviction import AccessInfo
from tiers.byte_copy import copy_bytes

if TYPE_CHECKING:
    from kvstore.config import StoreConfig
    from kvstore.layout import KVLayout
    from kvstore.stats import Counters
    from kvstore.store.layouts import LayoutSet
    from kvstore.store.write_errors import WriteErrors
    from kvstore.types import TierKind

    EmitFn = Callable[[str, bytes, TierKind], None]  # the store's event fan-out: (kind, key, tier)

logger = logging.getLogger(__name__)
_STOP = None


class _VanishedError(KVStoreError):
    """The index said a level held a chunk, but the tier no longer has it (a miss, not corruption)."""


class Mover:
    """Moves chunk bytes between the store's levels."""

    def __init__(self, levels: list[Level], layouts: LayoutSet, config: StoreConfig, index: ChunkIndex,
                 stats: Counters, emit: EmitFn, write_errors: WriteErrors) -> None:
        self.levels = levels
        self.layouts = layouts
        self.config = config
        self.index = index
        self.stats = stats
        self._emit = emit
        self.write_errors = write_errors
        self._staging = StagingBuffers()
        self.replica_levels = self._replica_levels()
        self._warned: set[str] = set()

    def _replica_levels(self) -> list[Level]:
        wanted = self.config.replicate_to
        below = self.levels[1:]
        if wanted is None:
            return [lv for lv in below if lv.config.is_disk]
        return [lv for lv in below if lv.kind in wanted]

    # ----- put and replication --------------------------------------------------------------
    def put_top(self, key: bytes, raw: torch.Tensor, info: AccessInfo, deadline: float, layout: KVLayout) -> None:
        top = self.levels[0]
        payload, meta = top.encode(raw, layout, key)
        self._store_in(top, key, payload, meta, info, deadline)

    def _store_in(self, level: Level, key: bytes, payload: torch.Tensor, meta: ChunkMeta, info: AccessInfo,
                  deadline: float, copy_of: Entry | None = None) -> None:
        """Make room and write one payload into a level, then record it in the index."""
        while True:
            self.make_room(level, meta.stored_bytes, deadline)
            try:
                level.tier.put(key, payload, meta)
                break
            except TierFullError:  # another writer took the room we made
                if time.monotonic() >= deadline:
                    raise
        self.record_stored(level, key, meta, info, copy_of=copy_of)

    def record_stored(self, level: Level, key: bytes, meta: ChunkMeta, info: AccessInfo,
                      copy_of: Entry | None = None) -> None:
        """Note in the index and the level's policy that `level` now holds `key`.

        `copy_of` is the entry a replica was copied from: if the chunk was removed while the copy
        was being written, the copy is deleted instead of resurrecting the chunk.
        """
        if not self.index.add_location_if_current(level, key, meta, info, copy_of):  # removed meanwhile
            level.tier.remove(key)
            return
        self._emit("stored", key, level.kind)
        self.stats.incr(f"{level.name}.puts")
        self.stats.incr(f"{level.name}.bytes_written", meta.stored_bytes)

    def enqueue_replicas(self, key: bytes, info: AccessInfo, deadline: float, result: PutResult,
                         levels: list[Level] | None = None) -> None:
        for level in self.replica_levels if levels is None else levels:
            queued = self.index.mark_pending(level, key, info)
            if queued is Queued.GONE:
                return
            if queued is Queued.DECLINED:
                continue
            assert level.queue is not None
            try:
                level.queue.put(key, timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:
                self.index.clear_pending(key, level.index)
                reason = (f"{level.name} write queue full ({level.queue.maxsize} chunks) for "
                          f"{self.config.put_timeout_s:g} s; the chunk stays in {self.levels[0].name} "
                          "and is demoted when evicted")
                result.not_replicated[key] = reason
                self.stats.incr(f"{level.name}.not_replicated")

    def start_writers(self) -> None:
        for level in self.replica_levels:
            level.queue = queue.Queue(maxsize=self.config.write_queue_depth)
            # A tier that may encode gets a writer per encoder on top: while every encoder codes a chunk,
            # writers_per_tier others write the chunks already coded, so the disk never waits on a codec
            # that has a chunk ready, and every core codes while chunks wait (Level.encode).
            encoding = level.encoders if level.config.codec != "none" else 0
            for n in range(self.config.writers_per_tier + encoding):
                thread = threading.Thread(target=self._writer, args=(level,), name=f"kv-write-{level.name}-{n}",
                                          daemon=True)
                thread.start()
                level.threads.append(thread)

    def _writer(self, level: Level) -> None:
        assert level.queue is not None
        while True:
            key = level.queue.get()
            if key is _STOP:
                level.queue.task_done()
                return
            try:
                self.copy_down(key, level, deadline=time.monotonic() + self.config.put_timeout_s)
            except Exception as exc:
                self.stats.incr(f"{level.name}.not_replicated")
                self.stats.incr(f"{level.name}.write_errors_{self.write_errors.note(level.name, exc)}")
                self.warn_once(f"write:{level.name}:{type(exc).__name__}", "%s write failed: %s", level.name, exc)
            finally:
                self.index.clear_pending(key, level.index)
                level.queue.task_done()

    def copy_down(self, key: bytes, dst: Level, deadline: float) -> None:
        """Write a copy of `key` into `dst` from the fastest level holding it."""
        source = self.index.pin_source(key, dst.index)
        if source is None:
            return
        try:
            with self._raw_view(self.levels[source.level_index], key, source.meta) as raw:
                if raw is None:
                    return
                payload, meta = self._encode_copy(dst, raw, source.meta, key)
                self._store_in(dst, key, payload, meta, source.info, deadline, copy_of=source.entry)
        finally:
            self.index.release(source.entry)

    def _encode_copy(self, dst: Level, raw: torch.Tensor, meta: ChunkMeta, key: bytes) -> tuple[torch.Tensor, ChunkMeta]:
        """A background write's payload for `dst`: encoded under the chunk's own layout, or stored raw when its
        layout is not registered in this process (a recovered chunk: a codec needs the shape)."""
        layout = self.layouts.by_fingerprint(meta.layout_fingerprint)
        if layout is None:
            return raw, ChunkMeta(codec_id=CODEC_NONE, raw_bytes=raw.numel(), stored_bytes=raw.numel(),
                                  layout_fingerprint=meta.layout_fingerprint)
        return dst.encode(raw, layout, key, background=True)

    @contextmanager
    def _raw_view(self, level: Level, key: bytes, meta: ChunkMeta) -> Iterator[torch.Tensor | None]:
        """Raw chunk bytes of `key` for the `with` block: the memory tier's slot itself under a lease
        when it is stored raw (write-through copies nothing; a 4 KiB-aligned host slot goes
        straight to O_DIRECT), else a decoded copy."""
        arena = level.tier.as_arena()
        if arena is None or meta.codec_id != 0:
            yield self.raw_copy(level, key, meta)
            return
        with arena.lease(key) as found:
            yield None if found is None else found[0]

    def raw_copy(self, level: Level, key: bytes, meta: ChunkMeta) -> torch.Tensor | None:
        """Raw chunk bytes of `key` from `level` (a view when stored raw in memory, else a copy)."""
        arena = level.tier.as_arena()
        if arena is not None and meta.codec_id == 0:
            raw = torch.empty(meta.raw_bytes, dtype=torch.uint8)
            with arena.lease(key) as found:
                if found is None:
                    return None
                copy_bytes(raw, found[0])
            return raw
        layout = self.layouts.by_fingerprint(meta.layout_fingerprint)
        if layout is None:  # a recovered chunk of a model not registered since: nothing can decode it
            raise KVStoreError(f"chunk {key.hex()} is of layout {meta.layout_fingerprint:016x}, not registered here")
        raw = torch.empty(meta.raw_bytes, dtype=torch.uint8)
        return raw if self.read_level(level.index, key, raw, layout) else None

    # ----- reads -----------------------------------------------------------------------------
    def read_level(self, level_index: int, key: bytes, out: torch.Tensor, layout: KVLayout, *,
                   promote: bool = False) -> bool:
        """Read `key` from one level into `out` (raw chunk bytes of `layout`). A failure is a miss, and so is
        a chunk stored under another layout (its header's fingerprint): never bytes of the wrong shape."""
        level = self.levels[level_index]
        entry, meta = self.index.meta(key, level_index)
        if meta is None:
            return False
        if meta.layout_fingerprint != layout.fingerprint or meta.raw_bytes != out.numel():
            self.stats.incr(f"{level.name}.layout_misses")
            return False
        try:
            self._read_into(level, key, meta, out, layout)
        except CorruptChunkError as exc:
            self.stats.incr(f"{level.name}.corrupt")
            self.warn_once(f"corrupt:{level.name}", "%s: %s; dropped, treated as a miss", level.name, exc)
            self.forget(level, key)
            return False
        except _VanishedError:
            self.stats.incr(f"{level.name}.vanished")
            self.forget(level, key)
            return False
        except (KVStoreError, OSError) as exc:
            self.stats.incr(f"{level.name}.read_errors")
            self.warn_once(f"read:{level.name}", "%s read failed: %s; treated as a miss", level.name, exc)
            return False
        self.stats.incr(f"{level.name}.hits")
        self.stats.incr(f"{level.name}.bytes_read", meta.stored_bytes)
        if promote and self.config.promote_on_read:
            self._promote(key, out, entry, layout)
        return True

    def _read_into(self, level: Level, key: bytes, meta: ChunkMeta, out: torch.Tensor, layout: KVLayout) -> None:
        direct = meta.codec_id == 0 and (out.device.type == "cpu" or level.tier.is_memory
                                         or level.tier.supports_device_io)
        target = out if direct else self._staging.get(meta.stored_bytes)
        if meta.codec_id == CODEC_NONE:
            nbytes = level.tier.get_into(key, target)
            if nbytes is not None and not direct:
                decode_into(meta, target[:nbytes], out, layout)
        else:  # decoded as it is read (levels.open_decoder), straight into `out`
            decoder = open_decoder(meta, target, out, layout)
            try:
                nbytes = level.tier.get_into_streamed(key, target, decoder.feed)
            except BaseException:
                decoder.cancel()  # no decode may still read the staging buffer or write `out`
                raise
            if nbytes is not None:
                decoder.finish(nbytes)
        if nbytes is None:  # removed underneath the index (e.g. by another node on a PFS)
            raise _VanishedError(f"{level.name} no longer holds chunk {key.hex()}")

    def forget(self, level: Level, key: bytes) -> None:
        self.index.forget(level, key)
        level.tier.remove(key)
        self._emit("removed", key, level.kind)

    def _promote(self, key: bytes, raw: torch.Tensor, entry: Entry | None, layout: KVLayout) -> None:
        top = self.levels[0]
        if entry is None or not top.tier.is_memory or top.index in self.index.levels_of(key):
            return
        info = AccessInfo(size_bytes=raw.numel(), position=entry.position)
        if not self.index.admits(top, key, info):
            return
        try:
            payload, meta = top.encode(raw.cpu() if raw.device.type != "cpu" else raw, layout, key)
            self._store_in(top, key, payload, meta, info, deadline=time.monotonic())
            self.stats.incr(f"{top.name}.promotions")
        except KVStoreError:
            self.stats.incr(f"{top.name}.promotions_skipped")

    # ----- eviction and demotion ------------------------------------------------------------------
    def make_room(self, level: Level, nbytes: int, deadline: float) -> None:
        """Evict from `level` until `nbytes` fit, waiting for pins until `deadline`.

        Raises:
            TierFullError: the payload is larger than the tier, or everything left stays pinned.
        """
        if level.tier.footprint(nbytes) > level.tier.capacity_bytes:
            raise TierFullError(f"a {nbytes}-byte chunk does not fit the {level.name} tier's "
                                f"{level.tier.capacity_bytes} bytes; raise its capacity")
        while not level.tier.can_fit(nbytes):
            victims = self.index.victims(level, 4)
            if not victims:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TierFullError(
                        f"{level.name} tier is full ({level.tier.used_bytes} of {level.tier.capacity_bytes} bytes) "
                        "and every chunk in it is pinned by readers or pending writes; retry later, "
                        "read less at once, or raise the tier's capacity")
                self.index.wait(min(0.05, remaining))
                continue
            evicted = 0
            for key, decision in plan_relief(self, level, victims):
                evicted += relieve(self, level, key, decision)
                if level.tier.can_fit(nbytes):
                    return
            if not evicted:
                self.index.wait(0.01)

    def evict(self, level: Level, key: bytes, *, reason: str, demote: bool = True) -> bool:
        """Drop `key` from `level`, demoting it first when no level below has a copy (and `demote`)."""
        pinned = self.index.pin_victim(level, key, demote=demote)
        if pinned is False:
            return False
        if pinned is True:  # not ours (stale, or another layout's chunk): reclaim the space
            return level.tier.remove(key)
        entry, needs_demotion = pinned
        try:
            if needs_demotion:
                self._demote(level, key)
        finally:
            self._drop_copy(level, key, entry)
        self.stats.incr(f"{level.name}.evictions" if reason == "capacity" else f"{level.name}.dropped")
        return True

    def _drop_copy(self, level: Level, key: bytes, entry: Entry) -> None:
        self.index.drop_copy(level, key, entry)
        level.tier.remove(key)
        self._emit("removed", key, level.kind)

    def _demote(self, level: Level, key: bytes) -> None:
        below = self.levels[level.index + 1 :]
        if not below:
            return
        target = below[0]
        try:
            self.copy_down(key, target, deadline=time.monotonic() + self.config.put_timeout_s)
            self.stats.incr(f"{level.name}.demotions")
        except KVStoreError as exc:
            self.stats.incr(f"{level.name}.lost_on_eviction")
            self.warn_once(f"demote:{level.name}", "demotion %s -> %s failed (%s); the chunk is dropped",
                            level.name, target.name, exc)

    # ----- lifecycle -------------------------------------------------------------------------------
    def flush(self, timeout_s: float | None = None) -> bool:
        end = None if timeout_s is None else time.monotonic() + timeout_s
        for level in self.replica_levels:
            assert level.queue is not None
            while level.queue.unfinished_tasks:
                if end is not None and time.monotonic() >= end:
                    return False
                time.sleep(0.002)
        return True

    def stop(self) -> None:
        self.flush()
        for level in self.replica_levels:
            assert level.queue is not None
            for _ in level.threads:
                level.queue.put(_STOP)
            for thread in level.threads:
                thread.join()
            level.threads.clear()

    def warn_once(self, tag: str, msg: str, *args: object) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            logger.warning(msg, *args)
