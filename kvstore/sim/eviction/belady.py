"""Belady's MIN (`min`): evict the chunk whose next use is farthest in the future (offline optimum).

MIN needs the future, so it only runs in simulation (`kvstore replay`) as the bound the online
policies are measured against. Give it the whole access sequence, in the order the cache will
call it, either at construction (`make_replay_policy("min", capacity=n, future=[k0, k1, ...])`) or later
with `prepare(future)`. Every access must then produce exactly one `on_insert` (miss) or
`on_access` (hit) call, in that order; MIN pairs the n-th call for a key with the key's n-th
position in the future. Keys never used again go first. Combined with insert-then-evict (the
replay inserts a missed block, then evicts), MIN may name the block just inserted: that is the
optimal "bypass" and makes MIN optimal for hit rate at unit sizes.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Container, Hashable, Iterable

from kvstore.sim.eviction.registry import register_offline_policy
from policies.eviction.base import AccessInfo

logger = logging.getLogger(__name__)

NEVER = 1 << 62


@register_offline_policy
class BeladyMINEvictionPolicy:
    """Farthest next use first; see the module docstring for how to feed it the future."""

    name = "min"

    def __init__(self, future: Iterable[Hashable] = (), capacity: int | None = None) -> None:
        del capacity  # MIN needs only the future
        self._positions: dict[Hashable, deque[int]] = {}
        self._next_use: dict[Hashable, int] = {}
        # max-heap on next use via negation; stale entries are skipped lazily.
        self._heap: list[tuple[int, int, Hashable]] = []
        self._stamp = 0
        self._stamps: dict[Hashable, int] = {}
        self.prepare(future)

    def prepare(self, future: Iterable[Hashable]) -> None:
        """Set the future access sequence (replaces any previous one)."""
        self._positions = {}
        for index, key in enumerate(future):
            self._positions.setdefault(key, deque()).append(index)

    def _advance(self, key: Hashable) -> None:
        queue = self._positions.get(key)
        if queue:
            queue.popleft()
        next_use = queue[0] if queue else NEVER
        self._stamp += 1
        self._next_use[key] = next_use
        self._stamps[key] = self._stamp
        heapq.heappush(self._heap, (-next_use, -self._stamp, key))

    def on_insert(self, key: Hashable, info: AccessInfo) -> None:
        self._advance(key)

    def on_access(self, key: Hashable, info: AccessInfo) -> None:
        if key in self._next_use:
            self._advance(key)

    def on_remove(self, key: Hashable) -> None:
        self._next_use.pop(key, None)
        self._stamps.pop(key, None)

    def next_use(self, key: Hashable) -> int | None:
        """Index in the future of the resident key's next access (NEVER if none), None if absent."""
        return self._next_use.get(key)

    def victims(self, n: int, pinned: Container[Hashable] = ()) -> list[Hashable]:
        out: list[Hashable] = []
        kept: list[tuple[int, int, Hashable]] = []
        while self._heap and len(out) < n:
            entry = heapq.heappop(self._heap)
            key = entry[2]
            if self._stamps.get(key) != -entry[1]:
                continue  # stale: the key was touched again or removed
            kept.append(entry)
            if key not in pinned:
                out.append(key)
        for entry in kept:  # popping was only a way to read the top; the state is unchanged
            heapq.heappush(self._heap, entry)
        return out

    def __len__(self) -> int:
        return len(self._next_use)
