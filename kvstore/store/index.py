"""The store's index: key -> which levels hold the chunk, pending writes, pins, chain position."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvstore.types import ChunkMeta


@dataclass(slots=True)
class Entry:
    """Where one chunk lives. Guarded by the store's lock.

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
        entry = self._lookup(key)  # type: ignore[arg-type]
        return entry is not None and entry.is_pinned
