"""LRU: evict the least recently used chunk."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable
from typing import ClassVar

from policies.eviction.base import AccessInfo
from policies.eviction.registry import register_eviction_policy


class LRUEvictionPolicy:
    """Least recently used first. Within one request's chain the cache touches the tail before
    the head, so the head ends most recent and a chain loses its tail first."""

    name: ClassVar[str] = "lru"

    def __init__(self, capacity: int | None = None) -> None:
        del capacity  # LRU needs no size
        self._order: OrderedDict[Hashable, None] = OrderedDict()

    def on_insert(self, key: Hashable, info: AccessInfo) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def on_access(self, key: Hashable, info: AccessInfo) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def on_remove(self, key: Hashable) -> None:
        self._order.pop(key, None)

    def victims(self, n: int, pinned: Container[Hashable] = ()) -> list[Hashable]:
        out: list[Hashable] = []
        for key in self._order:
            if len(out) >= n:
                break
            if key not in pinned:
                out.append(key)
        return out

    def __len__(self) -> int:
        return len(self._order)


register_eviction_policy(LRUEvictionPolicy)  # a statement, not a decorator: mypyc compiles only undecorated classes natively
