"""The index's records: `Entry` (where one chunk lives) and the small results ChunkIndex hands out."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvstore.types import ChunkMeta

if TYPE_CHECKING:
    from policies.eviction import AccessInfo


@dataclass(slots=True)
class Entry:
    """Where one chunk lives. Changed only by ChunkIndex methods, under its lock.

    `pins` counts readers and in-flight moves (a pinned chunk is never an eviction victim);
    `pending` holds the levels with a queued write that still needs a source copy.
    """

    raw_bytes: int
    where: dict[int, ChunkMeta] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)
    pins: int = 0
    position: int = 0

    def fastest(self) -> int | None:
        return min(self.where) if self.where else None

    def has_copy_below(self, level: int) -> bool:
        return any(other > level for other in self.where) or any(other > level for other in self.pending)

    @property
    def is_pinned(self) -> bool:
        return self.pins > 0 or bool(self.pending)


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
