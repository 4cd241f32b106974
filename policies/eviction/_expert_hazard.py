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

Memory and speed: the held keys and the ghost share one `SlotTable` (_fifo.py): a slot per key with
its 64-bit hash, its stamp (held: since << CLASS_BITS | class; ghost: the complement of eviction time
<< CLASS_BITS | class) and its neighbours on its class's list or the ghost's, in flat arrays; a ghost
slot keeps the hash alone, not the key. About 40 bytes a key where dicts of keys cost about 100 held
and 150 remembered (docs/adaptive.md, "Memory"); each class's rate counters and head are unboxed
fields of a native `ReuseClass` under mypyc. Decisions are exactly those of per-class OrderedDicts
(two keys with one 64-bit hash aside). `alpha`, the age exponent, is 1 here;
`hazard-a` (_expert_hazard_age.py) learns it. With an age exponent strictly between 0 and 1, heads
are ranked by rate ** (1 / alpha) / age, the same order as rate / age ** alpha,
with each class's power kept until its rate or alpha changes (`_blend_victim`), and taken as
exp(log(rate) / alpha) with the log kept too (compiled, exp and log are native calls and ** a call on
boxed floats): hazard-a went from about 1,100 to 860 ns an access on the conversation trace at 10%,
compiled, its victims unchanged on every cell of the margin benchmark (bench/adaptive_margin.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Container, Hashable, Iterable, Iterator
from typing import ClassVar, Final

from policies.eviction._expert_base import Expert
from policies.eviction._fifo import SlotTable

logger = logging.getLogger(__name__)

RUN_CLASSES: Final = 7  # first touches by miss run: 1, 2-3, 4-7, 8-15, 16-31, 32-63, 64+
TWICE: Final = RUN_CLASSES  # touched twice
OFTEN: Final = RUN_CLASSES + 1  # touched three times or more
NUM_CLASSES: Final = RUN_CLASSES + 2
GHOST: Final = NUM_CLASSES  # the ghost's list in the expert's SlotTable
CLASS_BITS: Final = 4  # a stamp is time << CLASS_BITS | class: unique per placement, and says the class
CLASS_MASK: Final = (1 << CLASS_BITS) - 1
DECAY_CAPACITIES = 8.0  # halve the rate counters every this many capacities of accesses
PRIOR_ENTRIES = 1.0  # a fresh class's rate is PRIOR_HITS / PRIOR_ENTRIES until it has data
PRIOR_HITS = 0.25
POWED_MIN: Final = 1e-280  # a class's rate ** (1 / alpha) ranks heads only inside this range (full precision, ...
POWED_MAX: Final = 1e280  # ... no overflow when divided by an age)


def _scaled(stamp: int, time_scale: float) -> int:
    """`stamp` (time << CLASS_BITS | class) with its time multiplied by `time_scale`."""
    if time_scale == 1.0:
        return stamp
    return int((stamp >> CLASS_BITS) * time_scale) << CLASS_BITS | stamp & CLASS_MASK


class ReuseClass:
    """One class's decayed re-touches (`hits`) and `entries`, and the `since` of its oldest key (`head`,
    -1: empty); its keys are a list of the expert's SlotTable."""

    def __init__(self) -> None:
        self.hits = PRIOR_HITS
        self.entries = PRIOR_ENTRIES
        self.head = -1
        # log(hits / entries) and (hits / entries) ** (1 / alpha) as last computed, and the hits, entries
        # and alpha they were computed from: the age-blend expert ranks by the power (`HazardExpert._blend_victim`)
        self.log_rate = 0.0
        self.powed = 0.0
        self.powed_hits = -1.0
        self.powed_entries = -1.0
        self.powed_alpha = -1.0


class HazardExpert(Expert):
    """Reuse-class LRU lists ranked by reuse rate / age (see the module docstring)."""

    name: ClassVar[str] = "hazard"
    ghost_hit_weight: ClassVar[float] = 1.0  # a ghost hit counts as a reuse of the class the key was evicted from

    def __init__(self, capacity: int, ghost_factor: float = 2.0) -> None:
        self.ghost_factor = ghost_factor
        self.resize(capacity)
        self.classes = [ReuseClass() for _ in range(NUM_CLASSES)]
        # Held keys and the ghost in one table: a held slot's stamp is since << CLASS_BITS | class (its
        # list: the class); a ghost slot's is ~(eviction time << CLASS_BITS | class), negative, keeps only
        # the key's hash and is on list GHOST.
        self.table = SlotTable(NUM_CLASSES + 1)
        self.held = 0
        self.now = 0
        self.run = 0  # new keys since the request's partial tail or its last hit
        self.alpha = 1.0  # the age exponent: score = rate / age ** alpha (1: log-uniform reuse distances)
        self.drops: list[Hashable] | None = None

    def resize(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._ghost_limit = self.ghost_factor * self.capacity
        self._decay_every = max(1, int(DECAY_CAPACITIES * self.capacity))

    def access(self, key: Hashable, partial: bool = False) -> bool:
        self.now = now = self.now + 1
        if now % self._decay_every == 0:
            for c in self.classes:
                c.entries *= 0.5
                c.hits *= 0.5
        table = self.table
        h = hash(key)
        slot = table.find(h)
        if slot >= 0:
            stamp = table.stamps[slot]
            if stamp >= 0:  # a hit: the key moves one class up (or stays in OFTEN)
                self.run = 0
                cls = stamp & CLASS_MASK
                old = self.classes[cls]
                old.hits += 1.0
                was_head = table.heads[cls] == slot
                table.unlink(cls, slot)
                self._place(slot, OFTEN if cls >= TWICE else TWICE, now)
                if was_head:
                    head = table.heads[cls]
                    old.head = table.stamps[head] >> CLASS_BITS if head >= 0 else -1
                return True
            table.unlink(GHOST, slot)  # a ghost hit: the key comes back one class up
            self.run = 0
            cls = ~stamp & CLASS_MASK
            self.classes[cls].hits += self.ghost_hit_weight
            table.keys[slot] = key
            self._place(slot, OFTEN if cls >= TWICE else TWICE, now)
        elif partial:  # a request's tail: the run starts after it
            self.run = 0
            return False
        else:
            self.run = run = self.run + 1
            cls = min(run.bit_length(), RUN_CLASSES) - 1
            self.classes[cls].entries += 1.0
            table.add(h, key, now << CLASS_BITS | cls, cls)
            c = self.classes[cls]
            if c.head < 0:
                c.head = now
        self.held += 1
        if self.held > self.capacity:
            self._evict(now + 1)
        return False

    def _place(self, slot: int, cls: int, now: int) -> None:
        """Put the table's `slot` (on no list) at the back of class `cls`, touched at `now`."""
        c = self.classes[cls]
        c.entries += 1.0
        table = self.table
        table.stamps[slot] = now << CLASS_BITS | cls
        table.push(cls, slot)
        if c.head < 0:
            c.head = now

    def _evict(self, now: int) -> None:
        """Drop the class head with the lowest rate / age ** alpha (ages count from 1 at `now`)."""
        classes = self.classes
        alpha = self.alpha
        victim_cls, victim_score = -1, 0.0
        if alpha != 1.0 and alpha != 0.0:
            victim_cls = self._blend_victim(now, alpha)
        for cls in range(NUM_CLASSES if victim_cls < 0 else 0):  # a native loop under mypyc (NUM_CLASSES is Final)
            c = classes[cls]
            if c.head >= 0:
                if alpha == 1.0:  # the plain expert: no power to take
                    score = c.hits / c.entries / (now - c.head)
                elif alpha == 0.0:
                    score = c.hits / c.entries
                else:
                    score = c.hits / c.entries / float(now - c.head) ** alpha
                if victim_cls < 0 or score < victim_score:
                    victim_cls, victim_score = cls, score
        table = self.table
        slot = table.heads[victim_cls]
        table.unlink(victim_cls, slot)
        head = table.heads[victim_cls]
        classes[victim_cls].head = table.stamps[head] >> CLASS_BITS if head >= 0 else -1
        self.held -= 1
        key = table.keys[slot]
        table.keys[slot] = None  # the ghost keeps the hash alone
        table.stamps[slot] = ~(now << CLASS_BITS | victim_cls)  # `now` is unique per eviction (one per access at most)
        table.push(GHOST, slot)
        if table.sizes[GHOST] > self._ghost_limit:
            table.remove(table.heads[GHOST], GHOST)
        if self.drops is not None and key is not None:
            self.drops.append(key)

    def _blend_victim(self, now: int, alpha: float) -> int:
        """The class whose head has the lowest rate / age ** alpha, 0 < alpha < 1, found as the lowest
        rate ** (1 / alpha) / age (the same order: x ** (1 / alpha) is increasing), with each class's
        rate ** (1 / alpha) kept from one eviction to the next until its rate or alpha changes: about
        one power an eviction rather than one a class. -1 when a power leaves the range where it keeps
        its precision (a rate far under 1 at a small alpha): the caller ranks by the powers of the ages."""
        classes = self.classes
        inverse = 1.0 / alpha
        victim_cls, victim_score = -1, 0.0
        for cls in range(NUM_CLASSES):
            c = classes[cls]
            if c.head >= 0:
                if c.powed_hits != c.hits or c.powed_entries != c.entries:
                    c.log_rate = math.log(c.hits / c.entries)
                    c.powed_hits, c.powed_entries, c.powed_alpha = c.hits, c.entries, -1.0
                if c.powed_alpha != alpha:  # exp and log are native calls under mypyc; ** is a boxed one
                    c.powed = math.exp(c.log_rate * inverse)
                    c.powed_alpha = alpha
                powed = c.powed
                if not POWED_MIN < powed < POWED_MAX:
                    return -1
                score = powed / (now - c.head)
                if victim_cls < 0 or score < victim_score:
                    victim_cls, victim_score = cls, score
        return victim_cls

    def _slot_of(self, key: Hashable) -> int:
        return self.table.find(hash(key))

    def __contains__(self, key: Hashable) -> bool:
        slot = self.table.find(hash(key))
        return slot >= 0 and self.table.stamps[slot] >= 0

    def __len__(self) -> int:
        return self.held

    def class_of(self, key: Hashable) -> int:
        """The class `key` is held in; -1: not held."""
        slot = self._slot_of(key)
        stamp = self.table.stamps[slot] if slot >= 0 else -1
        return stamp & CLASS_MASK if stamp >= 0 else -1

    def ghost_class_of(self, key: Hashable) -> int:
        """The class the ghost remembers `key` was evicted from; -1: not remembered."""
        slot = self._slot_of(key)
        stamp = self.table.stamps[slot] if slot >= 0 else 0
        return ~stamp & CLASS_MASK if stamp < 0 else -1

    def class_keys(self, cls: int) -> list[Hashable]:
        """The keys held in class `cls`, oldest first."""
        keys = self.table.keys
        return [key for key in (keys[slot] for slot in self.table.slots(cls)) if key is not None]

    @property
    def where(self) -> dict[Hashable, int]:
        """A copy: held key -> stamp (since << CLASS_BITS | class)."""
        table = self.table
        out: dict[Hashable, int] = {}
        for cls in range(NUM_CLASSES):
            for slot in table.slots(cls):
                key = table.keys[slot]
                if key is not None:
                    out[key] = table.stamps[slot]
        return out

    @property
    def ghost(self) -> dict[int, int]:
        """A copy: remembered key's hash -> stamp (eviction time << CLASS_BITS | class), oldest first."""
        table = self.table
        return {table.hashes[slot]: ~table.stamps[slot] for slot in table.slots(GHOST)}

    def ghost_hashes(self) -> list[int]:
        """The hashes of the keys the ghost remembers, oldest first."""
        table = self.table
        return [table.hashes[slot] for slot in table.slots(GHOST)]

    def order(self) -> Iterator[Hashable]:
        for cls in range(NUM_CLASSES):
            yield from self.class_keys(cls)

    def by_touch(self) -> list[Hashable]:
        """The held keys, least recently touched first (by stamp: time first)."""
        where = self.where
        return sorted(where, key=where.__getitem__)

    def reused(self) -> Container[Hashable]:
        return set(self.class_keys(TWICE)) | set(self.class_keys(OFTEN))

    def seed(self, keys: Iterable[Hashable], reused: Container[Hashable] = ()) -> None:
        table = self.table
        for key in keys:  # no entries counted: a seeded key is not a new observation
            self.now += 1
            cls = TWICE if key in reused else 0
            h = hash(key)
            slot = table.find(h)
            if slot >= 0:  # seeded twice: its later place counts
                stamp = table.stamps[slot]
                table.remove(slot, stamp & CLASS_MASK if stamp >= 0 else GHOST)
                self.held -= stamp >= 0
            table.add(h, key, self.now << CLASS_BITS | cls, cls)
            self.held += 1
            if self.classes[cls].head < 0:
                self.classes[cls].head = self.now

    def take_classes(self, old: HazardExpert, resident: Container[Hashable],
                     ghost_keys: Container[int] | None = None, time_scale: float = 1.0) -> None:
        """Fill this empty expert with `old`'s keys that are `resident`, each in its class and with its
        stamp (so its age), and with `old`'s ghost (only the entries whose key hash is in `ghost_keys` when
        given): a handover between hazard variants loses no class. `time_scale`: this expert's accesses
        per one of `old`'s (a shadow on a sample of `old`'s keys sees that rate of its accesses), so ages
        keep their meaning."""
        self.now = int(old.now * time_scale)
        table, source = self.table, old.table
        for cls in range(NUM_CLASSES):
            for slot in source.slots(cls):
                key = source.keys[slot]
                if key is not None and key in resident:
                    table.add(source.hashes[slot], key, _scaled(source.stamps[slot], time_scale), cls)
                    self.held += 1
            head = table.heads[cls]
            self.classes[cls].head = table.stamps[head] >> CLASS_BITS if head >= 0 else -1
        for slot in source.slots(GHOST):
            h = source.hashes[slot]
            if ghost_keys is None or h in ghost_keys:
                table.add(h, None, ~_scaled(~source.stamps[slot], time_scale), GHOST)

    def take_rates(self, source: HazardExpert, scale: float) -> None:
        """Start from `source`'s class rates (its counts x `scale`: a shadow of a sample counts fewer accesses)."""
        for cls in range(NUM_CLASSES):
            self.classes[cls].hits = source.classes[cls].hits * scale
            self.classes[cls].entries = source.classes[cls].entries * scale


class ResidentHazardExpert(HazardExpert):
    """The hazard expert with rates from resident hits only (see the module docstring)."""

    name: ClassVar[str] = "hazard-r"
    ghost_hit_weight: ClassVar[float] = 0.0
