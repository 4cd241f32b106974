"""A lazily cleaned min-heap keyed by priority, shared by the priority-ordered eviction policies."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Container, Hashable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)
P = TypeVar("P")  # a priority: anything ordered (a number, a tuple of numbers)


class LazyHeap(Generic[P]):
    """Min-heap of (priority, key); updating a key pushes a new entry and the old one goes stale.

    `smallest` reads the top without changing what the heap holds (stale entries are dropped,
    which no caller can observe).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[P, int, Hashable]] = []
        self._stamps: dict[Hashable, int] = {}
        self._stamp = 0

    def push(self, key: Hashable, priority: P) -> None:
        self._stamp += 1
        self._stamps[key] = self._stamp
        heapq.heappush(self._heap, (priority, self._stamp, key))
        if len(self._heap) > 4 * len(self._stamps) + 64:
            self._compact()

    def discard(self, key: Hashable) -> None:
        self._stamps.pop(key, None)

    def priority(self, key: Hashable) -> P | None:
        for prio, stamp, k in self._heap:  # rare path (tests, explicit removal)
            if k == key and self._stamps.get(k) == stamp:
                return prio
        return None

    def smallest(self, n: int, pinned: Container[Hashable] = ()) -> list[tuple[P, Hashable]]:
        out: list[tuple[P, Hashable]] = []
        kept: list[tuple[P, int, Hashable]] = []
        while self._heap and len(out) < n:
            entry = heapq.heappop(self._heap)
            if self._stamps.get(entry[2]) != entry[1]:
                continue
            kept.append(entry)
            if entry[2] not in pinned:
                out.append((entry[0], entry[2]))
        for entry in kept:
            heapq.heappush(self._heap, entry)
        return out

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if self._stamps.get(e[2]) == e[1]]
        heapq.heapify(self._heap)

    def __contains__(self, key: object) -> bool:
        return key in self._stamps

    def __len__(self) -> int:
        return len(self._stamps)
