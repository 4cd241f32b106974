"""LFU with dynamic aging (`lfu`, LFU-DA): evict the lowest `age + frequency`, age = last victim's value."""

from __future__ import annotations

import logging
from collections.abc import Container, Hashable

from policies.eviction._heap import LazyHeap
from policies.eviction.base import AccessInfo
from policies.eviction.registry import register_eviction_policy

logger = logging.getLogger(__name__)


@register_eviction_policy
class LFUEvictionPolicy:
    """Least frequently used with dynamic aging (Arlitt et al., LFU-DA).

    A chunk's priority is `age + hits` where `age` is the priority of the last chunk evicted, so
    a chunk that was popular long ago cannot stay forever: new chunks start at the current age.
    Ties go tail first (higher chain position), then least recently touched.
    """

    name = "lfu"

    def __init__(self, capacity: int | None = None) -> None:
        del capacity  # LFU needs no size
        self._heap: LazyHeap[tuple[float, int]] = LazyHeap()
        self._count: dict[Hashable, int] = {}
        self._value: dict[Hashable, float] = {}
        self._position: dict[Hashable, int] = {}
        self._age = 0.0

    def _push(self, key: Hashable) -> None:
        value = self._age + self._count[key]
        self._value[key] = value
        self._heap.push(key, (value, -self._position[key]))

    def on_insert(self, key: Hashable, info: AccessInfo) -> None:
        self._count[key] = 1
        self._position[key] = info.position
        self._push(key)

    def on_access(self, key: Hashable, info: AccessInfo) -> None:
        if key in self._count:
            self._count[key] += 1
            self._push(key)

    def on_remove(self, key: Hashable) -> None:
        if key not in self._count:
            return
        smallest = self._heap.smallest(1)
        if smallest and smallest[0][1] == key:  # an eviction: the cache's age moves up to it
            self._age = max(self._age, self._value[key])
        self._heap.discard(key)
        del self._count[key], self._value[key], self._position[key]

    def victims(self, n: int, pinned: Container[Hashable] = ()) -> list[Hashable]:
        return [key for _, key in self._heap.smallest(n, pinned)]

    def __len__(self) -> int:
        return len(self._count)
