"""LRU experts for `adaptive`, one per build: on a StampedQueue compiled, on an OrderedDict interpreted.

Both decide alike (tests/policies/test_expert_lru.py replays them side by side). Compiled by
mypyc, an OrderedDict's `move_to_end` and `popitem` are generic method calls (about 0.25 us a
block together on the conversation trace), where a StampedQueue hit is a dict store and two list
appends; interpreted, those OrderedDict methods are C and the queue's Python steps cost twice as
much. `LRU` is the one for the running build (`COMPILED`: this module was loaded from a mypyc
build, not from its `.py`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable, Iterable, Iterator
from typing import ClassVar, Final

from policies.eviction._expert_base import Expert
from policies.eviction._fifo import StampedQueue

COMPILED: Final = not __file__.endswith(".py")


class StampedLRUExpert(Expert):
    """Least recently used on a StampedQueue (_fifo.py): `stamps` maps a held key to its last touch."""

    name: ClassVar[str] = "lru"

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.stamps: dict[Hashable, int] = {}
        self.queue = StampedQueue()
        self.clock = 0
        self.drops: list[Hashable] | None = None

    def access(self, key: Hashable, partial: bool = False) -> bool:
        stamps, queue = self.stamps, self.queue
        hit = key in stamps
        if partial and not hit:  # a prompt's partly filled last block: never seen again (every expert refuses it)
            return False
        self.clock = clock = self.clock + 1
        if hit:
            queue.live -= 1  # its old entry dies
        stamps[key] = clock
        keys = queue.keys  # StampedQueue.push, inlined
        keys.append(key)
        queue.stamps.append(clock)
        queue.live += 1
        if len(keys) > queue.limit:
            queue.compact(stamps)
        if not hit and len(stamps) > self.capacity:
            victim = queue.pop_first(stamps)
            if self.drops is not None:
                self.drops.append(victim)
        return hit

    def resize(self, capacity: int) -> None:
        self.capacity = max(1, capacity)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.stamps

    def order(self) -> Iterator[Hashable]:
        return iter(self.queue.live_keys(self.stamps))

    def reused(self) -> Container[Hashable]:
        return ()

    def seed(self, keys: Iterable[Hashable], reused: Container[Hashable] = ()) -> None:
        for key in keys:
            if key not in self.stamps:
                self.clock += 1
                self.stamps[key] = self.clock
                self.queue.push(key, self.clock, self.stamps)


class OrderedLRUExpert(Expert):
    """Least recently used on an OrderedDict."""

    name: ClassVar[str] = "lru"

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.cache: OrderedDict[Hashable, None] = OrderedDict()
        self.drops: list[Hashable] | None = None

    def access(self, key: Hashable, partial: bool = False) -> bool:
        cache = self.cache
        if key in cache:
            cache.move_to_end(key)
            return True
        if partial:  # a prompt's partly filled last block: never seen again (every expert refuses it)
            return False
        cache[key] = None
        if len(cache) > self.capacity:
            victim, _ = cache.popitem(False)
            if self.drops is not None:
                self.drops.append(victim)
        return False

    def resize(self, capacity: int) -> None:
        self.capacity = max(1, capacity)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.cache

    def order(self) -> Iterator[Hashable]:
        return iter(self.cache)

    def reused(self) -> Container[Hashable]:
        return ()

    def seed(self, keys: Iterable[Hashable], reused: Container[Hashable] = ()) -> None:
        for key in keys:
            self.cache[key] = None


LRU: Final[type[Expert]] = StampedLRUExpert if COMPILED else OrderedLRUExpert
