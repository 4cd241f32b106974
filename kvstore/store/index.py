"""`ChunkIndex`: the store's one owner of shared state (entries, pins, pending writes, the lock).

Locking rules (the only place they are written down):

- One re-entrant lock, owned here. Every read or change of an `Entry`, and every call into a
  level's eviction or admission policy (they are not thread-safe), happens inside a ChunkIndex
  method, under that lock. Helpers (mover, pressure, reads, recovery, host plane) call these
  methods; none of them holds the lock itself.
- No I/O under the lock: tier reads, writes, encodes and copies run outside it. The one
  exception is the host tier's in-memory `acquire` in `lease_if_held`, which must be atomic with
  the pin it takes.
- A pinned entry (`pins > 0`, or a queued write still needing it as a source) is never an
  eviction victim. Whoever pins unpins: `unpin(keys)` or `release(entry)`.
- The condition is notified whenever a pin or a pending write is released or a location is
  added; `make_room` and `wait_durable` wait on it with a timeout.
- An `Entry` object is a token: a copy written from it is recorded only if the key still maps
  to the same object (`add_location_if_current`), so a removed chunk is never resurrected.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar, cast

from kvstore.key_table import key_map
from kvstore.store.entry import Entry, PinnedView, Queued, ReadPlan, SourceCopy
from kvstore.types import ChunkMeta, shared_meta
from policies.eviction import AccessInfo

if TYPE_CHECKING:
    from kvstore.store.levels import Level

T = TypeVar("T")

class ChunkIndex:
    """key -> Entry, with the lock, the condition and the pins. Thread-safe; see the module rules."""

    def __init__(self, levels: Sequence[Level]) -> None:
        self._levels = levels
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._entries: dict[bytes, Entry] = key_map()  # a KeyIndex (C, compact) or a dict
        self._pinned = PinnedView(self._entries.get)
        # `holds(key)`: is the key indexed? A lock-free read, in C (lookups walk hundreds of keys); KeyIndex runs no
        # Python code in a lookup, so it is atomic under the GIL as a dict's is.
        self.holds: Callable[[object], bool] = self._entries.__contains__

    # ----- reads --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def meta(self, key: bytes, level_index: int) -> tuple[Entry | None, ChunkMeta | None]:
        """The entry of `key` and the metadata of its copy in one level (None where absent)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry, entry.meta(level_index) if entry else None

    def levels_of(self, key: bytes) -> list[int]:
        """Level indices holding `key`, fastest first (empty when absent)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry.levels() if entry else []

    def victim_state(self, key: bytes, level_index: int) -> tuple[ChunkMeta, bool] | None:
        """A victim's metadata in one level and whether a level below has (or is getting) a copy."""
        with self._lock:
            entry = self._entries.get(key)
            meta = entry.meta(level_index) if entry else None
            if entry is None or meta is None:
                return None
            return meta, entry.has_copy_below(level_index)

    def snapshot(self) -> list[tuple[bytes, list[int]]]:
        """Every key and the levels holding it (fastest first)."""
        with self._lock:
            return [(key, entry.levels()) for key, entry in self._entries.items()]

    # ----- locations ----------------------------------------------------------------------------
    def add_location(self, level: Level, key: bytes, meta: ChunkMeta, info: AccessInfo) -> None:
        """Record that `level` holds `key` and tell the level's eviction policy if it is new."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = Entry(info.position)
            if entry.set_meta(level.index, shared_meta(meta)):
                level.eviction.on_insert(key, info)
            self._cond.notify_all()

    def add_location_if_current(self, level: Level, key: bytes, meta: ChunkMeta, info: AccessInfo,
                                copy_of: Entry | None) -> bool:
        """`add_location`, unless `copy_of` is given and `key` no longer maps to it. True when recorded."""
        with self._lock:
            if copy_of is not None and self._entries.get(key) is not copy_of:
                return False
            self.add_location(level, key, meta, info)
            return True

    def replace_meta(self, level: Level, key: bytes, meta: ChunkMeta) -> None:
        """A copy was re-encoded in place: update its metadata (or re-add it if a reader forgot it)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.meta(level.index) is not None:
                entry.set_meta(level.index, shared_meta(meta))
                return
        self.add_location(level, key, meta, AccessInfo(size_bytes=meta.stored_bytes))

    def forget(self, level: Level, key: bytes) -> None:
        """Drop `level`'s copy of `key` from the index (the tier's copy is the caller's to remove)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.drop(level.index) is not None:
                level.eviction.on_remove(key)
                if not entry.mask and not entry.pending:
                    del self._entries[key]

    def pop(self, key: bytes) -> dict[int, ChunkMeta]:
        """Remove `key` entirely; returns level index -> metadata of the copies it had (their policies
        are told), so a caller whose delete fails on a tier can `add_location` that copy back."""
        with self._lock:
            entry = self._entries.pop(key, None)
            where = entry.metas() if entry else {}
            for level_index in where:
                self._levels[level_index].eviction.on_remove(key)
            return where

    # ----- policy calls -------------------------------------------------------------------------
    def admits(self, level: Level, key: bytes, info: AccessInfo) -> bool:
        with self._lock:
            return level.admits(key, info)

    def touch(self, keys: Sequence[bytes], infos: Sequence[AccessInfo], touched: Sequence[bool]) -> None:
        """An access to a chain: each level's policy hears of it tail before head (head ends most recent)."""
        with self._lock:
            for i in range(len(keys) - 1, -1, -1):
                entry = self._entries.get(keys[i]) if touched[i] else None
                for level_index in entry.levels() if entry is not None else ():
                    self._levels[level_index].eviction.on_access(keys[i], infos[i])

    def touch_existing(self, key: bytes, info: AccessInfo, replica_levels: Iterable[Level]) -> list[Level] | None:
        """A put of a chunk already held: an access. Returns the replica levels lacking a copy, or
        None when the chunk is not held (the put must store it)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not entry.mask:
                return None
            for level_index in entry.levels():
                self._levels[level_index].eviction.on_access(key, info)
            have = entry.mask | entry.pending
            return [lv for lv in replica_levels if not have >> lv.index & 1]

    def victims(self, level: Level, n: int) -> list[bytes]:
        """Up to `n` eviction candidates of `level` (pinned chunks skipped)."""
        with self._lock:
            return cast("list[bytes]", level.eviction.victims(n, self._pinned))  # the store's keys are bytes

    def wait(self, timeout_s: float) -> None:
        """Sleep until a pin or pending write is released or a location added (or the timeout)."""
        with self._cond:
            self._cond.wait(timeout=timeout_s)

    # ----- pins ---------------------------------------------------------------------------------
    def pin_prefix(self, keys: Iterable[bytes]) -> int:
        """Pin the leading run of held keys; returns how many were pinned."""
        pinned = 0
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:
                    break
                entry.pins += 1
                pinned += 1
        return pinned

    def unpin(self, keys: Iterable[bytes]) -> None:
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None:
                    entry.pins -= 1
            self._cond.notify_all()

    def release(self, entry: Entry) -> None:
        """Undo a pin taken through `pin_source`, `pin_victim` or `pin_raw`."""
        with self._lock:
            entry.pins -= 1
            self._cond.notify_all()

    def plan_reads(self, keys: Sequence[bytes]) -> ReadPlan:
        """Pin every held key of a get and split them into memory reads and disk-only reads."""
        plan = ReadPlan(pinned=[], memory_jobs=[], disk_jobs=[])
        with self._lock:
            for i, key in enumerate(keys):
                entry = self._entries.get(key)
                fastest = entry.fastest() if entry else None
                if entry is None or fastest is None:
                    continue
                entry.pins += 1
                plan.pinned.append(key)
                if self._levels[fastest].tier.is_memory:
                    plan.memory_jobs.append((i, fastest))
                else:
                    plan.disk_jobs.append(i)
        return plan

    def disk_levels(self, key: bytes) -> set[int]:
        """The disk levels holding `key` now (empty when it was removed since planning)."""
        with self._lock:
            entry = self._entries.get(key)
            return {lv for lv in entry.levels() if not self._levels[lv].tier.is_memory} if entry else set()

    def pin_source(self, key: bytes, dst_index: int) -> SourceCopy | None:
        """Pin the fastest copy of `key` as the source of a copy into `dst_index`; None when there
        is nothing to copy (absent, or `dst_index` already holds it)."""
        with self._lock:
            entry = self._entries.get(key)
            source = entry.fastest() if entry is not None and entry.meta(dst_index) is None else None
            meta = None if entry is None or source is None else entry.meta(source)
            if entry is None or source is None or meta is None:
                return None
            entry.pins += 1
            return SourceCopy(entry, source, meta, AccessInfo(size_bytes=meta.raw_bytes, position=entry.position))

    def pin_victim(self, level: Level, key: bytes, *, demote: bool) -> tuple[Entry, bool] | bool:
        """Pin `level`'s copy of `key` for eviction. Returns (entry, needs_demotion); False when it is
        pinned (not a victim now); True when the index does not know it there (stale or another
        layout's chunk: the policy is repaired, the caller reclaims the tier's space)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.meta(level.index) is None:
                level.eviction.on_remove(key)
                return True
            if entry.is_pinned:
                return False
            entry.pins += 1
            return entry, demote and not entry.has_copy_below(level.index)

    def drop_copy(self, level: Level, key: bytes, entry: Entry) -> None:
        """Release a `pin_victim` pin and drop `level`'s copy from the index and its policies."""
        with self._lock:
            entry.pins -= 1
            if entry.drop(level.index) is not None:
                level.eviction.on_remove(key)
                if level.admission is not None:
                    level.admission.on_evict(key)
            if not entry.mask and not entry.pending and self._entries.get(key) is entry:
                del self._entries[key]
            self._cond.notify_all()

    def pin_raw(self, level: Level, key: bytes) -> tuple[Entry, ChunkMeta] | None:
        """Pin an unpinned, raw (uncompressed) copy of `key` in `level` for re-encoding in place."""
        with self._lock:
            entry = self._entries.get(key)
            meta = entry.meta(level.index) if entry else None
            if entry is None or meta is None or entry.is_pinned or meta.codec_id != 0:
                return None
            entry.pins += 1
            return entry, meta

    def lease_if_held(self, key: bytes, level_index: int, acquire: Callable[[], T | None]) -> tuple[bool, T | None]:
        """Call `acquire()` (in-memory, no I/O) while `level_index` holds `key`, pinning the entry on
        success. Returns (whether any level holds `key`, what `acquire` found or None)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return False, None
            found = acquire() if entry.mask >> level_index & 1 else None
            if found is not None:
                entry.pins += 1
            return True, found

    # ----- replica writes ---------------------------------------------------------------------
    def mark_pending(self, level: Level, key: bytes, info: AccessInfo) -> Queued:
        """Ask `level`'s admission, then note a queued write to it (a pending write pins the source)."""
        with self._lock:
            if not level.admits(key, info):
                return Queued.DECLINED
            entry = self._entries.get(key)
            if entry is None:
                return Queued.GONE
            entry.pending |= 1 << level.index
            return Queued.YES

    def clear_pending(self, key: bytes, level_index: int) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.pending &= ~(1 << level_index)
            self._cond.notify_all()

    def wait_written(self, keys: Sequence[bytes], timeout_s: float) -> None:
        """Wait until no key has a pending replica write, or `timeout_s` passed."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                pending = [k for k in keys if (e := self._entries.get(k)) is not None and e.pending]
                remaining = deadline - time.monotonic()
                if not pending or remaining <= 0:
                    return
                self._cond.wait(timeout=min(remaining, 0.05))
