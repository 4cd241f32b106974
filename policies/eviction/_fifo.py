"""`StampedQueue`: keys in arrival order with lazy deletion, the hazard expert's per-class LRU lists and ghost.

::

    keys    [ k1  k2  k7  k2  k9 ...]      an entry is live while index[key] == its stamp,
    stamps  [ s1  s2  s7  s2' s9 ...]      so moving k2 to the back is one dict store (index[k2] = s2')
              ^ start: entries before it are gone                   and one append per list

An OrderedDict does the same with a node per key, and under mypyc each `popitem`, `pop` and
`next(iter(...))` is a generic method call that builds a tuple or an iterator. Here the owner keeps
`index` (key -> stamp, stamps unique) and the queue holds two plain lists and an integer, so every
step is a native list operation; a dead entry costs one dict lookup when the front passes it. The
lists are compacted (the consumed front cut off, then dead entries dropped when they still
outnumber the live ones) whenever they outgrow their limit (twice their length after the last
compaction, plus SLACK), so they hold at most 4 entries per live key (as of that compaction) plus
3 x SLACK, and each dead entry costs at most two lookups over its life.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final

SLACK: Final = 1024  # entries a queue may hold beyond twice its size before it is compacted


class StampedQueue:
    """The live entries of `index` in push order (see the module docstring); `live` counts them,
    kept by the owner: +1 per `push`, -1 whenever it removes a key of this queue from `index`."""

    def __init__(self) -> None:
        self.keys: list[Hashable] = []
        self.stamps: list[int] = []
        self.start = 0
        self.live = 0
        self.limit = SLACK  # compact when the lists grow past this

    def push(self, key: Hashable, stamp: int, index: dict[Hashable, int]) -> None:
        """Append `key` (the owner has set index[key] = stamp)."""
        self.keys.append(key)
        self.stamps.append(stamp)
        self.live += 1
        if len(self.keys) > self.limit:
            self.compact(index)

    def first(self, index: dict[Hashable, int]) -> int:
        """The stamp of the oldest live entry (dead ones in front of it are passed); -1: none."""
        keys, stamps = self.keys, self.stamps
        i = self.start
        n = len(keys)
        while i < n:
            if index.get(keys[i], -1) == stamps[i]:
                self.start = i
                return stamps[i]
            i += 1
        self.start = n
        return -1

    def pop_first(self, index: dict[Hashable, int]) -> Hashable:
        """Remove the oldest live key from the queue and from `index`; the queue must hold one."""
        keys, stamps = self.keys, self.stamps
        i = self.start
        while index.get(keys[i], -1) != stamps[i]:
            i += 1
        key = keys[i]
        self.start = i + 1
        self.live -= 1
        del index[key]
        return key

    def compact(self, index: dict[Hashable, int]) -> None:
        """Cut off the consumed front; drop the dead entries too when they outnumber the live ones."""
        keys, stamps = self.keys, self.stamps
        if self.start:
            del keys[: self.start]
            del stamps[: self.start]
            self.start = 0
        if len(keys) > 2 * self.live + SLACK:  # mostly dead entries behind the front: drop them
            live = [i for i in range(len(keys)) if index.get(keys[i], -1) == stamps[i]]
            self.keys = [keys[i] for i in live]
            self.stamps = [stamps[i] for i in live]
        self.limit = 2 * len(self.keys) + SLACK

    def live_keys(self, index: dict[Hashable, int]) -> list[Hashable]:
        """The live keys, oldest first."""
        keys, stamps = self.keys, self.stamps
        return [keys[i] for i in range(self.start, len(keys)) if index.get(keys[i], -1) == stamps[i]]
