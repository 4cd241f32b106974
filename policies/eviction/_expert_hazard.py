"""Hazard expert for `adaptive`: one LRU list per touch class; evict the head with the lowest reuse rate / age.

::

    class 0: keys touched once   ─┐  each an LRU list (oldest first); per class a decayed
    class 1: keys touched twice  ─┼─ reuse rate r_c = re-touches / entries (hits and ghost
    class 2: keys touched 3+     ─┘  hits alike); victim = argmin over the 3 heads of r_c / age

Why r_c / age: a key's chance of a re-touch in the next unit of time is its class's reuse rate
times the density of reuse distances at its age. When reuse distances spread evenly over the
octaves (log-uniform, density ~ 1 / age; the conversation trace's first re-touches do so from
4k to 64k accesses), that product is r_c / age, and evicting its minimum is the greedy choice
with no scale to tune. It is LRU within a class, and across classes it keeps a key of a class
reused twice as often twice as long. A key the ghost (`ghost_factor` capacities of evicted keys)
still remembers comes back one class up, as in 2Q; a prompt's partly filled last block is not
admitted (its key never comes back). Rates decay by half every DECAY_CAPACITIES capacities of
accesses so they follow the workload. The idea is PACE's (reuse classes, a score by class and
age) without its age histograms: three classes and one division per class head per eviction.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Container, Hashable, Iterable, Iterator

logger = logging.getLogger(__name__)

NUM_CLASSES = 3  # touched once, twice, three times or more
DECAY_CAPACITIES = 8.0  # halve the rate counters every this many capacities of accesses
PRIOR_ENTRIES = 1.0  # a fresh class's rate is PRIOR_HITS / PRIOR_ENTRIES until it has data
PRIOR_HITS = 0.25


class HazardExpert:
    """Touch-class LRU lists ranked by reuse rate / age (see the module docstring)."""

    name = "hazard"
    ghost_hit_weight = 1.0  # a ghost hit counts as a reuse of the class the key was evicted from

    def __init__(self, capacity: int, ghost_factor: float = 2.0) -> None:
        self.ghost_factor = ghost_factor
        self.resize(capacity)
        self.lists: list[OrderedDict[Hashable, int]] = [OrderedDict() for _ in range(NUM_CLASSES)]  # key -> since
        self.where: dict[Hashable, int] = {}  # resident key -> class
        self.ghost: OrderedDict[Hashable, int] = OrderedDict()  # evicted key -> class
        self.entries = [PRIOR_ENTRIES] * NUM_CLASSES
        self.hits = [PRIOR_HITS] * NUM_CLASSES
        self.now = 0
        self.on_drop: Callable[[Hashable], None] | None = None

    def resize(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._ghost_limit = self.ghost_factor * self.capacity
        self._decay_every = max(1, int(DECAY_CAPACITIES * self.capacity))

    def access(self, key: Hashable, partial: bool = False) -> bool:
        self.now += 1
        if self.now % self._decay_every == 0:
            self.entries = [v * 0.5 for v in self.entries]
            self.hits = [v * 0.5 for v in self.hits]
        where = self.where
        cls = where.get(key)
        if cls is not None:
            self.hits[cls] += 1.0
            del self.lists[cls][key]
            self._place(key, min(cls + 1, NUM_CLASSES - 1))
            return True
        cls = self.ghost.pop(key, None)
        if cls is not None:
            self.hits[cls] += self.ghost_hit_weight
            self._place(key, min(cls + 1, NUM_CLASSES - 1))
        elif partial:
            return False
        else:
            self._place(key, 0)
        if len(where) > self.capacity:
            self._evict()
        return False

    def _place(self, key: Hashable, cls: int) -> None:
        self.where[key] = cls
        self.lists[cls][key] = self.now
        self.entries[cls] += 1.0

    def _evict(self) -> None:
        now, hits, entries = self.now, self.hits, self.entries
        victim_cls, victim_score = -1, 0.0
        for cls, lst in enumerate(self.lists):
            if lst:
                score = hits[cls] / entries[cls] / (now - lst[next(iter(lst))] + 1)
                if victim_cls < 0 or score < victim_score:
                    victim_cls, victim_score = cls, score
        key, _ = self.lists[victim_cls].popitem(last=False)
        del self.where[key]
        ghost = self.ghost
        ghost[key] = victim_cls
        if len(ghost) > self._ghost_limit:
            ghost.popitem(last=False)
        if self.on_drop is not None:
            self.on_drop(key)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.where

    def order(self) -> Iterator[Hashable]:
        for lst in self.lists:
            yield from lst

    def reused(self) -> Container[Hashable]:
        return {key for key, cls in self.where.items() if cls > 0}

    def seed(self, keys: Iterable[Hashable], reused: Container[Hashable] = ()) -> None:
        for key in keys:  # no entries counted: a seeded key is not a new observation
            self.now += 1
            cls = 1 if key in reused else 0
            self.where[key] = cls
            self.lists[cls][key] = self.now


class ResidentHazardExpert(HazardExpert):
    """The hazard expert with rates from resident hits only: a reuse the ghost sees after eviction
    does not count, so a class the cache cannot keep long enough to hit looks dead (quick
    demotion of one-shot keys, as S3-FIFO's small queue; on long-gap chat it starves new keys)."""

    name = "hazard-r"
    ghost_hit_weight = 0.0
