"""Key-only simulated caches (ARC, S3-FIFO, 2Q; LRU in _expert_lru.py, hazard in _expert_hazard.py) that `adaptive` runs as experts and follows.

Each expert is a whole cache of `capacity` keys in one method: `access(key, partial)` returns
whether the key was held, and admits it (evicting as the policy does) when it was not. The
evicted keys are appended to `drops` when it is a list. `order()` lists the held keys in eviction order
(roughly, for ARC), `seed(keys, reused)` fills an empty expert with keys oldest first (those another expert
marked as `reused()` go to its protected part), so the adaptive
policy can hand its content to another expert. ARC's and 2Q's FIFO ends are popped with `popitem(False)`:
positional, it skips keyword parsing (0.1 us a call, several calls per eviction). S3-FIFO, which runs at full
size on every access, keeps its queues in plain lists instead: compiled, adaptive's conversation replay went
from 0.44 to 0.46-0.47 x LRU's speed; interpreted, this expert alone is about 20% slower than on OrderedDicts.
LRU, ARC and S3-FIFO decide as the registered policies do, with one exception: like every expert, they
refuse a prompt's partly filled last block, which the registered classics admit (its key is fresh on every
request); 2Q is only an expert here.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Container, Hashable, Iterable, Iterator
from typing import ClassVar

from policies.eviction._expert_base import Expert
from policies.eviction._expert_hazard import HazardExpert, ResidentHazardExpert
from policies.eviction._expert_hazard_age import AgeBlendHazardExpert
from policies.eviction._expert_lru import LRU
from policies.eviction._fifo import StampedQueue

logger = logging.getLogger(__name__)

FRONT_SLACK = 1024  # a FIFO list's consumed front is cut off once it is this long and half the list


def _front(queue: list[Hashable], start: int) -> int:
    """The front index of `queue` once its first `start` entries are consumed: they are cut off (index 0)
    when they are over FRONT_SLACK and half the list, so a list holds at most twice its live keys plus the slack."""
    if start > FRONT_SLACK and 2 * start > len(queue):
        del queue[:start]
        return 0
    return start


class ARCExpert(Expert):
    """ARC (Megiddo & Modha 2003), the textbook algorithm over unit-size keys."""

    name: ClassVar[str] = "arc"
    skip_partial = True

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.p = 0.0
        self.t1: OrderedDict[Hashable, None] = OrderedDict()
        self.t2: OrderedDict[Hashable, None] = OrderedDict()
        self.b1: OrderedDict[Hashable, None] = OrderedDict()
        self.b2: OrderedDict[Hashable, None] = OrderedDict()
        self.drops: list[Hashable] | None = None

    def _replace(self, from_b2: bool) -> None:
        t1 = self.t1
        if t1 and (len(t1) > self.p or (from_b2 and len(t1) == self.p)):
            victim, _ = t1.popitem(False)
            self.b1[victim] = None
        else:
            victim, _ = self.t2.popitem(False)
            self.b2[victim] = None
        if self.drops is not None:
            self.drops.append(victim)

    def access(self, key: Hashable, partial: bool = False) -> bool:
        t1, t2, b1, b2, c = self.t1, self.t2, self.b1, self.b2, self.capacity
        if key in t1:
            del t1[key]
            t2[key] = None
            return True
        if key in t2:
            t2.move_to_end(key)
            return True
        if key in b1:  # T1 was too small: favour recency
            self.p = min(float(c), self.p + max(len(b2) / len(b1), 1.0))
            self._replace(False)
            del b1[key]
            t2[key] = None
            return False
        if key in b2:  # T2 was too small: favour frequency
            self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
            self._replace(True)
            del b2[key]
            t2[key] = None
            return False
        if partial and self.skip_partial:  # a prompt's partly filled last block: never seen again
            return False
        self._make_room_for_new()
        t1[key] = None
        return False

    def _make_room_for_new(self) -> None:
        t1, b1, c = self.t1, self.b1, self.capacity
        if len(t1) + len(b1) >= c:
            if len(t1) < c:
                b1.popitem(False)
                self._replace(False)
            else:
                victim, _ = t1.popitem(False)
                if self.drops is not None:
                    self.drops.append(victim)
            return
        total = len(t1) + len(b1) + len(self.t2) + len(self.b2)
        if total >= c:
            if total >= 2 * c:
                self.b2.popitem(False)
            if len(t1) + len(self.t2) >= c:
                self._replace(False)

    def resize(self, capacity: int) -> None:
        self.capacity = max(1, capacity)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.t1 or key in self.t2

    def order(self) -> Iterator[Hashable]:
        first, second = (self.t1, self.t2) if len(self.t1) > self.p else (self.t2, self.t1)
        yield from first
        yield from second

    def reused(self) -> Container[Hashable]:
        return self.t2

    def seed(self, keys: Iterable[Hashable], reused: Container[Hashable] = ()) -> None:
        for key in keys:
            (self.t2 if key in reused else self.t1)[key] = None


class S3FIFOExpert(Expert):
    """S3-FIFO (Yang et al., SOSP'23): small FIFO S (10%), main FIFO M with reinsertion, ghost G.

    S and M are plain lists read from a front index (`small_start`, `main_start`): keys only leave
    them at the front, so every entry past the index is held, once. The ghost is a dict (key ->
    stamp) over a StampedQueue, as the hazard expert's. Compiled by mypyc, an OrderedDict's
    `popitem` is a generic method call that builds a tuple; here each step is a native list or dict
    operation. Decisions are those of the OrderedDict version (tests/policies/test_expert_s3fifo.py).
    """

    name: ClassVar[str] = "s3fifo"
    MAX_FREQ: ClassVar[int] = 3

    def __init__(self, capacity: int, small_ratio: float = 0.1) -> None:
        self.small_ratio = small_ratio
        self.resize(capacity)
        self.small: list[Hashable] = []
        self.small_start = 0
        self.main: list[Hashable] = []
        self.main_start = 0
        self.freq: dict[Hashable, int] = {}  # held key -> uses since it entered its queue, at most MAX_FREQ
        self.ghost: dict[Hashable, int] = {}  # evicted from S, not yet forgotten -> stamp
        self.ghost_queue = StampedQueue()
        self.clock = 0  # ghost stamps
        self.drops: list[Hashable] | None = None

    def resize(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._small_target = max(1, int(self.capacity * self.small_ratio))
        self._ghost_limit = max(1, self.capacity - int(self.capacity * self.small_ratio))

    def access(self, key: Hashable, partial: bool = False) -> bool:
        freq = self.freq
        f = freq.get(key, -1)
        if f >= 0:
            if f < self.MAX_FREQ:
                freq[key] = f + 1
            return True
        if partial:  # a prompt's partly filled last block: never seen again (every expert refuses it)
            return False
        while len(freq) >= self.capacity:
            self._evict()
        freq[key] = 0
        ghost = self.ghost
        if key in ghost:
            del ghost[key]
            self.ghost_queue.live -= 1
            self.main.append(key)
        else:
            self.small.append(key)
        return False

    def _evict(self) -> None:
        small, main, freq = self.small, self.main, self.freq
        if len(small) - self.small_start >= self._small_target or self.main_start == len(main):
            i = self.small_start
            while i < len(small):
                key = small[i]
                i += 1
                f = freq[key]
                if f > 0:  # used while on probation: promote
                    main.append(key)
                    freq[key] = 0
                    continue
                self.small_start = _front(small, i)
                del freq[key]
                self._remember(key)
                self._dropped(key)
                return
            self.small_start = _front(small, i)
        i = self.main_start
        while i < len(main):
            key = main[i]
            i += 1
            f = freq[key]
            if f > 0:  # reinsert with one use less
                main.append(key)
                freq[key] = f - 1
                continue
            self.main_start = _front(main, i)
            del freq[key]
            self._dropped(key)
            return
        self.main_start = _front(main, i)

    def _remember(self, key: Hashable) -> None:
        self.clock = clock = self.clock + 1
        ghost, queue = self.ghost, self.ghost_queue
        ghost[key] = clock
        queue.push(key, clock, ghost)
        if len(ghost) > self._ghost_limit:
            queue.pop_first(ghost)

    def _dropped(self, key: Hashable) -> None:
        if self.drops is not None:
            self.drops.append(key)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.freq

    def order(self) -> Iterator[Hashable]:
        yield from self.small[self.small_start:]
        yield from self.main[self.main_start:]

    def reused(self) -> Container[Hashable]:
        return set(self.main[self.main_start:])

    def seed(self, keys: Iterable[Hashable], reused: Container[Hashable] = ()) -> None:
        for key in keys:
            (self.main if key in reused else self.small).append(key)
            self.freq[key] = 0


class TwoQueueExpert(Expert):
    """2Q-style (Johnson & Shasha 1994): new keys on a probation FIFO (`probation_ratio` of the
    capacity); a hit there or a miss found in the ghost of probation's evictions moves a key to a
    protected LRU. A prompt's partly filled last block is not admitted (its key never comes back)."""

    name: ClassVar[str] = "2q"

    def __init__(self, capacity: int, probation_ratio: float = 0.5, ghost_factor: float = 2.0) -> None:
        self.probation_ratio = probation_ratio
        self.ghost_factor = ghost_factor
        self.resize(capacity)
        self.probation: OrderedDict[Hashable, None] = OrderedDict()
        self.protected: OrderedDict[Hashable, None] = OrderedDict()
        self.ghost: OrderedDict[Hashable, None] = OrderedDict()
        self.drops: list[Hashable] | None = None

    def resize(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._probation_limit = self.capacity * self.probation_ratio
        self._ghost_limit = self.capacity * self.ghost_factor

    def access(self, key: Hashable, partial: bool = False) -> bool:
        probation, protected = self.probation, self.protected
        if key in protected:
            protected.move_to_end(key)
            return True
        if key in probation:
            del probation[key]
            protected[key] = None
            return True
        if partial:
            return False
        if key in self.ghost:
            del self.ghost[key]
            protected[key] = None
        else:
            probation[key] = None
        self._fit()
        return False

    def _fit(self) -> None:
        probation, protected = self.probation, self.protected
        while len(probation) + len(protected) > self.capacity:
            if len(probation) > self._probation_limit or not protected:
                victim, _ = probation.popitem(False)
                self.ghost[victim] = None
                if len(self.ghost) > self._ghost_limit:
                    self.ghost.popitem(False)
            else:
                victim, _ = protected.popitem(False)
            if self.drops is not None:
                self.drops.append(victim)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.probation or key in self.protected

    def order(self) -> Iterator[Hashable]:
        yield from self.probation
        yield from self.protected

    def reused(self) -> Container[Hashable]:
        return self.protected

    def seed(self, keys: Iterable[Hashable], reused: Container[Hashable] = ()) -> None:
        for key in keys:
            (self.protected if key in reused else self.probation)[key] = None


def access_all(expert: Expert, keys: list[Hashable], partial: list[bool]) -> int:
    """Run `keys` through `expert` in order; its hits. A loop rather than `sum(map(expert.access, ...))`:
    compiled by mypyc each call is a native one (no bound method, no argument parsing)."""
    hits = 0
    for i in range(len(keys)):
        if expert.access(keys[i], partial[i]):
            hits += 1
    return hits


EXPERTS: dict[str, type[Expert]] = {e.name: e for e in (LRU, ARCExpert, S3FIFOExpert, TwoQueueExpert,
                                                         HazardExpert, ResidentHazardExpert, AgeBlendHazardExpert)}
