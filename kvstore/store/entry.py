"""The index's records: `Entry` (where one chunk lives) and the small results ChunkIndex hands out."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstore.types import ChunkMeta

if TYPE_CHECKING:
    from policies.eviction import AccessInfo


PENDING_SHIFT = 24  # `Entry.pins`: readers below this bit, the pending levels' mask from it
READERS = (1 << PENDING_SHIFT) - 1


class Entry:
    """Where one chunk lives. Changed only by ChunkIndex methods, under its lock.

    `pins` counts readers and in-flight moves (a pinned chunk is never an eviction victim) in its low
    24 bits; above them, `pending` is a bit mask of the levels with a queued write that still needs a
    source copy (a pending write pins the entry too).

    The daemon holds one Entry per chunk, millions of them, so it is four slots and no containers (64
    bytes with its GC header; a fifth slot would round it up to 80):
    `mask` has bit i set when level i holds a copy, and `_meta` is that copy's metadata when every
    held level has the same one (the common case: metadata objects are shared, `shared_meta`), else a
    tuple indexed by level (None where no copy is held).
    """

    __slots__ = ("_meta", "mask", "pins", "position")

    def __init__(self, position: int = 0) -> None:
        self.mask = 0
        self._meta: ChunkMeta | tuple[ChunkMeta | None, ...] | None = None
        self.pins = 0
        self.position = position

    @property
    def pending(self) -> int:
        """Bit i set: a queued write to level i still needs this chunk's source copy."""
        return self.pins >> PENDING_SHIFT

    @pending.setter
    def pending(self, levels: int) -> None:
        self.pins = (self.pins & READERS) | levels << PENDING_SHIFT

    def meta(self, level: int) -> ChunkMeta | None:
        """The metadata of `level`'s copy, None when that level holds none."""
        if not self.mask >> level & 1:
            return None
        meta = self._meta
        return meta[level] if isinstance(meta, tuple) else meta

    def levels(self) -> list[int]:
        """The level indices holding a copy, fastest first."""
        mask = self.mask
        return [i for i in range(mask.bit_length()) if mask >> i & 1]

    def metas(self) -> dict[int, ChunkMeta]:
        """Level index -> metadata of every copy."""
        return {i: meta for i in self.levels() if (meta := self.meta(i)) is not None}

    def set_meta(self, level: int, meta: ChunkMeta) -> bool:
        """Record `level`'s copy; True when that level held none before."""
        fresh = not self.mask >> level & 1
        if not self.mask & ~(1 << level):
            self.mask, self._meta = 1 << level, meta
            return fresh
        metas = self._by_level(max(self.mask.bit_length(), level + 1))
        metas[level] = meta
        self.mask |= 1 << level
        self._pack(metas)
        return fresh

    def drop(self, level: int) -> ChunkMeta | None:
        """Forget `level`'s copy; returns its metadata (None when it held none)."""
        meta = self.meta(level)
        if meta is None:
            return None
        metas = self._by_level(self.mask.bit_length())
        metas[level] = None
        self.mask &= ~(1 << level)
        self._pack(metas)
        return meta

    def _by_level(self, n: int) -> list[ChunkMeta | None]:
        return [self.meta(i) for i in range(n)]

    def _pack(self, metas: list[ChunkMeta | None]) -> None:
        held = [m for m in metas if m is not None]
        if not held:
            self._meta = None
        elif all(m is held[0] for m in held):
            self._meta = held[0]
        else:
            self._meta = tuple(metas[: self.mask.bit_length()])

    def fastest(self) -> int | None:
        mask = self.mask
        return (mask & -mask).bit_length() - 1 if mask else None

    def has_copy_below(self, level: int) -> bool:
        return bool((self.mask | self.pins >> PENDING_SHIFT) >> (level + 1))

    @property
    def is_pinned(self) -> bool:
        return self.pins != 0  # readers, moves or pending writes


class PinnedView:
    """`key in view` is True for chunks an eviction policy must skip (pinned or still a write source)."""

    __slots__ = ("_lookup",)

    def __init__(self, lookup: Callable[[bytes], Entry | None]) -> None:
        self._lookup = lookup

    def __contains__(self, key: object) -> bool:
        entry = self._lookup(key) if isinstance(key, bytes) else None
        return entry is not None and entry.is_pinned


class Queued(enum.Enum):
    """What `mark_pending` did with a replica write."""

    YES = "yes"  # admitted; the level is now pending for the key
    DECLINED = "declined"  # the level's admission policy said no
    GONE = "gone"  # the chunk left the index meanwhile


@dataclass(frozen=True, slots=True)
class SourceCopy:
    """A pinned source for a copy: the entry (release it when done), where to read, and the access."""

    entry: Entry
    level_index: int
    meta: ChunkMeta
    info: AccessInfo


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """The held keys of a get, pinned: memory reads as (position, level index), disk-only positions."""

    pinned: list[bytes]
    memory_jobs: list[tuple[int, int]]
    disk_jobs: list[int]
