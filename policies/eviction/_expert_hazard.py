"""Hazard expert for `adaptive`: LRU lists per reuse class; evict the head with the lowest reuse rate / age.

::

    first touch, k-th new key of its request's miss run:  k = 1 | 2-3 | 4-7 | ... | 64+  ─┐ each an LRU
    touched twice (a resident or ghost hit)                                               ─┼─ list, per
    touched three times or more                                                           ─┘ class a rate
    victim = argmin over the class heads of  r_c / age        r_c = re-touches / entries (decayed)

Why r_c / age: a key's chance of a re-touch in the next unit of time is its class's reuse rate
times the density of reuse distances at its age. When reuse distances spread evenly over the
octaves (log-uniform, density ~ 1 / age; the conversation trace's first re-touches do so from
4k to 64k accesses), that product is r_c / age, and evicting its minimum is the greedy choice
with no scale to tune. It is LRU within a class, and across classes it keeps a key of a class
reused twice as often twice as long.

Classes: how often the key was touched (once, twice, 3+; a key the ghost of `ghost_factor`
capacities still remembers comes back one class up, as in 2Q), and for a first touch its place
in its request's run of new keys. The cache touches a request tail first, so a run counts the
new keys since the request's partly filled last block or its last hit: a turn that adds a few
blocks to a known conversation makes a short run, a one-shot long prompt (a scan, a new
document) a long one, and each run length learns its own rate. A prompt's partly filled last
block is not admitted (its key never comes back). Rates decay by half every DECAY_CAPACITIES
capacities of accesses so they follow the workload.

`HazardExpert` counts a ghost hit as a reuse of the class the key was evicted from;
`ResidentHazardExpert` counts resident hits only, so a class that the cache cannot keep until
its reuse looks dead (quick demotion, as S3-FIFO's small queue). The idea is PACE's (reuse
classes, a score by class and age) without its age histograms: one division per class head
per eviction.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Container, Hashable, Iterable, Iterator
from typing import ClassVar, Final

from policies.eviction._expert_base import Expert

logger = logging.getLogger(__name__)

RUN_CLASSES: Final = 7  # first touches by miss run: 1, 2-3, 4-7, 8-15, 16-31, 32-63, 64+
TWICE: Final = RUN_CLASSES  # touched twice
OFTEN: Final = RUN_CLASSES + 1  # touched three times or more
NUM_CLASSES: Final = RUN_CLASSES + 2
DECAY_CAPACITIES = 8.0  # halve the rate counters every this many capacities of accesses
PRIOR_ENTRIES = 1.0  # a fresh class's rate is PRIOR_HITS / PRIOR_ENTRIES until it has data
PRIOR_HITS = 0.25


class HazardExpert(Expert):
    """Reuse-class LRU lists ranked by reuse rate / age (see the module docstring)."""

    name: ClassVar[str] = "hazard"
    ghost_hit_weight: ClassVar[float] = 1.0  # a ghost hit counts as a reuse of the class the key was evicted from

    def __init__(self, capacity: int, ghost_factor: float = 2.0) -> None:
        self.ghost_factor = ghost_factor
        self.resize(capacity)
        self.lists: list[OrderedDict[Hashable, int]] = [OrderedDict() for _ in range(NUM_CLASSES)]  # key -> since
        self.heads = [-1] * NUM_CLASSES  # each list's first `since` (unique per key); -1: empty
        self.where: dict[Hashable, int] = {}  # resident key -> class
        self.ghost: OrderedDict[Hashable, int] = OrderedDict()  # evicted key -> class
        self.entries = [PRIOR_ENTRIES] * NUM_CLASSES
        self.hits = [PRIOR_HITS] * NUM_CLASSES
        self.now = 0
        self.run = 0  # new keys since the request's partial tail or its last hit
        self.on_drop: Callable[[Hashable], None] | None = None

    def resize(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._ghost_limit = self.ghost_factor * self.capacity
        self._decay_every = max(1, int(DECAY_CAPACITIES * self.capacity))

    def access(self, key: Hashable, partial: bool = False) -> bool:
        self.now = now = self.now + 1
        if now % self._decay_every == 0:
            self.entries = [v * 0.5 for v in self.entries]
            self.hits = [v * 0.5 for v in self.hits]
        where = self.where
        cls = where.get(key)
        if cls is not None:
            self.run = 0
            self.hits[cls] += 1.0
            lst = self.lists[cls]
            if lst.pop(key) == self.heads[cls]:
                self.heads[cls] = next(iter(lst.values())) if lst else -1
            self._place(key, OFTEN if cls >= TWICE else TWICE, now)
            return True
        cls = self.ghost.pop(key, None)
        if cls is not None:
            self.run = 0
            self.hits[cls] += self.ghost_hit_weight
            cls = OFTEN if cls >= TWICE else TWICE
        elif partial:  # a request's tail: the run starts after it
            self.run = 0
            return False
        else:
            self.run = run = self.run + 1
            cls = min(run.bit_length(), RUN_CLASSES) - 1
        self._place(key, cls, now)
        if len(where) > self.capacity:
            self._evict(now + 1)
        return False

    def _place(self, key: Hashable, cls: int, now: int) -> None:
        self.where[key] = cls
        self.lists[cls][key] = now
        self.entries[cls] += 1.0
        if self.heads[cls] < 0:
            self.heads[cls] = now

    def _evict(self, now: int) -> None:
        """Drop the class head with the lowest rate / age (ages count from 1 at `now`)."""
        hits, entries, heads = self.hits, self.entries, self.heads
        victim_cls, victim_score = -1, 0.0
        for cls in range(NUM_CLASSES):  # a native loop under mypyc (NUM_CLASSES is Final)
            head = heads[cls]
            if head >= 0:
                score = hits[cls] / entries[cls] / (now - head)
                if victim_cls < 0 or score < victim_score:
                    victim_cls, victim_score = cls, score
        lst = self.lists[victim_cls]
        key, _ = lst.popitem(False)  # positional: no keyword parsing
        heads[victim_cls] = next(iter(lst.values())) if lst else -1
        del self.where[key]
        ghost = self.ghost
        ghost[key] = victim_cls
        if len(ghost) > self._ghost_limit:
            ghost.popitem(False)
        if self.on_drop is not None:
            self.on_drop(key)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.where

    def order(self) -> Iterator[Hashable]:
        for lst in self.lists:
            yield from lst

    def reused(self) -> Container[Hashable]:
        return {key for key, cls in self.where.items() if cls >= TWICE}

    def seed(self, keys: Iterable[Hashable], reused: Container[Hashable] = ()) -> None:
        for key in keys:  # no entries counted: a seeded key is not a new observation
            self.now += 1
            cls = TWICE if key in reused else 0
            self.where[key] = cls
            self.lists[cls][key] = self.now
            if self.heads[cls] < 0:
                self.heads[cls] = self.now


class ResidentHazardExpert(HazardExpert):
    """The hazard expert with rates from resident hits only (see the module docstring)."""

    name: ClassVar[str] = "hazard-r"
    ghost_hit_weight: ClassVar[float] = 0.0
