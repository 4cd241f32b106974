"""PACE (`pace`, replay-only): prefix-aware eviction and admission by per-class reuse probability learned online.

Why: in prefix-cached KV traffic most blocks are used once (a conversation that does not come
back, a prompt's partly filled last block), and they push out the blocks that will be reused.
With perfect reuse labels LRU is optimal on such traffic, so the whole game is predicting reuse.
PACE predicts it from what the cache itself observes, with no trace-specific constants:

* Class: at each touch a block falls in a class, touches (0, 1, 2, 3+, kept across evictions by
  the ghost and the touch memory) x its chain's turn (1..4+: 1 + the turn of the deepest block of
  the request seen before, set when the request's head is touched), or the partial-block class.
* Statistics: per class, age histograms in logical time (block touches): `reuse[c][b]` counts
  re-touches at age bucket b (resident and ghost hits alike), `end[c][b]` blocks the ghost forgot
  at age b. Blocks still resident or in the ghost are right-censored (they add the time waited so
  far, no reuse). A block of class c aged a scores its expected reuses per touch of cache time
  over the horizon T (touches for the cache to turn over at the current miss rate); sparse classes
  are pulled toward their touch class, which is pulled toward all.
* Eviction: an LRU list per class; the victim is the oldest block of the class whose score at
  that block's age is lowest (a chain's tail is touched first, so it is older and goes first).
* Admission: a missed block enters when its class's score at age 0 is at least `strictness` x the
  next victim's. `strictness` adapts like ARC's target (a ghost hit on a denied block lowers it,
  one on an evicted block raises it) and starts at 0 (admit everything).
* Guard (`_lru_guard.py`): a key-only shadow LRU of the same size; when its lead over the last
  horizon is significant the cache follows LRU for half a horizon, then tries PACE again.

docs/pace.md has why each mechanism is there, how the constants were chosen, the limits and the
evidence. Args of `PACEEvictionPolicy`: `capacity` (blocks the cache holds; None: inferred, the cache
is "full" once it has evicted), `ghost_factor` (ghost size in capacities).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Container, Hashable, Iterator
from typing import NamedTuple

from kvstore.sim.eviction._age_stats import BUCKET_OF_AGE, NUM_BUCKETS, TABLE_AGES, bucket, bucket_floor, row_scores
from kvstore.sim.eviction._lru_guard import LRUGuard
from kvstore.sim.eviction.registry import register_replay_policy
from policies.eviction.base import AccessInfo

logger = logging.getLogger(__name__)

MAX_TOUCH = 3
MAX_TURN = 4
PARTIAL_CLASS = 0
ADMISSION_STEP = 0.01  # per missed reuse, ARC-style, scaled by the ghost's mix of denied/evicted keys
MAX_STRICTNESS = 4.0
NUM_CLASSES = 1 + (MAX_TOUCH + 1) * MAX_TURN
TURN_SHIFT = 16  # a block's state packs touches (low bits) and its chain's turn count
TOUCH_MASK = (1 << TURN_SHIFT) - 1
MEMORY_FACTOR = 1.5  # capacities of keys the ghost forgot whose touch/turn state is still kept


class Resident(NamedTuple):
    """A resident block: its class and its state (touches | turn << TURN_SHIFT)."""

    cls: int
    state: int


class GhostEntry(NamedTuple):
    """A block remembered after eviction or denied admission, its episode still open."""

    cls: int
    state: int
    since: int  # logical time of its last touch
    evicted: bool  # True: evicted; False: denied admission


# Short-lived records built on every touch or in the victim search's inner loop: plain tuples (a
# NamedTuple's constructor is a Python call, ~10x a tuple's), always unpacked by name where used.
PendingMiss = tuple[Hashable, int, int]  # (key, cls, state): classified by on_miss, awaiting on_insert
RequestBlock = tuple[int, Hashable, bool, bool]  # (position, key, seen, partial): sorted when the request closes
ClassHead = tuple[Hashable, int]  # (key, since): the oldest unpinned block of a class list
Candidate = tuple[float, int]  # (score, cls): the class to evict from next and its head's score


def _touches(state: int) -> int:
    return state & TOUCH_MASK


def _turn(state: int) -> int:
    return state >> TURN_SHIFT


def _class_of(state: int, is_partial: bool) -> int:
    if is_partial:
        return PARTIAL_CLASS
    touches, turn = state & TOUCH_MASK, state >> TURN_SHIFT  # _touches, _turn inlined: a hot path
    return 1 + min(touches, MAX_TOUCH) * MAX_TURN + max(0, min(turn, MAX_TURN) - 1)


def _age_bucket(age: int) -> int:
    return BUCKET_OF_AGE[age] if age < TABLE_AGES else bucket(age)


@register_replay_policy
class PACEEvictionPolicy:
    """Prefix-aware, class-based reuse estimation; eviction and admission (see module docstring)."""

    name = "pace"

    def __init__(self, capacity: int | None = None, ghost_factor: float = 1.5) -> None:
        self._capacity = capacity
        self._ghost_factor = ghost_factor
        self._now = 0
        self._lists: list[OrderedDict[Hashable, int]] = [OrderedDict() for _ in range(NUM_CLASSES)]  # key -> since
        self._where: dict[Hashable, Resident] = {}
        self._ghost: OrderedDict[Hashable, GhostEntry] = OrderedDict()
        self._memory: OrderedDict[Hashable, int] = OrderedDict()  # key the ghost forgot -> state
        self._reuse = [[0.0] * NUM_BUCKETS for _ in range(NUM_CLASSES)]
        self._end = [[0.0] * NUM_BUCKETS for _ in range(NUM_CLASSES)]
        self._scores = [[0.5] * NUM_BUCKETS for _ in range(NUM_CLASSES)]
        self._horizon = float(capacity or 1024)
        self._events = 0
        self._full = False
        self._pending: PendingMiss | None = None
        self._inserts = 0
        self._strictness = 0.0  # start permissive, as ARC's target starts at 0
        self._flag_counts = {False: 0, True: 0}  # ghost entries: denied (False) / evicted (True)
        self._request: list[RequestBlock] = []
        self._head_seen = False
        self._inserts_at_refresh = (0, 0)
        self._guard = LRUGuard()  # a key-only LRU of the same size over the same touches

    def _size(self) -> int:
        """Blocks the cache holds: the capacity when known, else what it holds now."""
        return self._capacity or len(self._where) or 1

    # -- bookkeeping ------------------------------------------------------------------------
    def _observe_reuse(self, cls: int, since: int) -> None:
        self._reuse[cls][bucket(self._now - since)] += 1.0
        self._tick()

    def _tick(self) -> None:
        self._events += 1
        interval = max(256, self._size() // 4)
        if self._events % interval == 0:
            self._refresh_scores()
        if self._events % (64 * interval) == 0:
            for table in (self._reuse, self._end):
                for row in table:
                    row[:] = [v * 0.5 for v in row]

    def _ghost_limit(self, size: int) -> int:
        return max(16, int(size * self._ghost_factor))

    def _remember(self, key: Hashable, cls: int, state: int, since: int, evicted: bool = False) -> None:
        self._memory.pop(key, None)
        old = self._ghost.get(key)
        if old is not None:
            self._flag_counts[old.evicted] -= 1
        self._flag_counts[evicted] += 1
        self._ghost[key] = GhostEntry(cls, state, since, evicted)
        self._ghost.move_to_end(key)
        size = self._size()
        while len(self._ghost) > self._ghost_limit(size):
            old_key, forgotten = self._ghost.popitem(last=False)
            self._flag_counts[forgotten.evicted] -= 1
            self._end[forgotten.cls][bucket(self._now - forgotten.since)] += 1.0
            self._memory[old_key] = forgotten.state  # the episode ends here; the touch count lives on
        memory_limit = int(size * MEMORY_FACTOR)
        while len(self._memory) > memory_limit:
            self._memory.popitem(last=False)

    def on_miss(self, key: Hashable, info: AccessInfo) -> None:
        """Record the miss: a ghost hit is an observed reuse; the key (re)enters the ghost."""
        self._close_if_done()
        self._now += 1
        state = 0
        ghost = self._ghost.pop(key, None)
        if ghost is not None:
            self._learn_from_ghost_hit(ghost)
            state = ghost.state + 1
        remembered = self._memory.pop(key, None) if ghost is None else None
        if remembered is not None:  # not a reuse for the statistics (its episode has ended)
            state = remembered + 1
        self._guard.touch(key, False, self._size())
        cls = _class_of(state, info.is_partial)
        self._remember(key, cls, state, self._now)
        self._pending = (key, cls, state)
        self._inserts += 1  # misses, admitted or not: the horizon must not depend on admission
        self._note_request(key, ghost is not None or remembered is not None, info)

    def _learn_from_ghost_hit(self, ghost: GhostEntry) -> None:
        """A reuse the cache missed: blame eviction (be stricter) or admission (be laxer)."""
        self._flag_counts[ghost.evicted] -= 1
        denied, evicted = self._flag_counts[False] + 1, self._flag_counts[True] + 1
        step = ADMISSION_STEP * denied / evicted if ghost.evicted else -ADMISSION_STEP * evicted / denied
        self._strictness = min(MAX_STRICTNESS, max(0.0, self._strictness + step))
        self._observe_reuse(ghost.cls, ghost.since)

    def on_evict(self, key: Hashable) -> None:
        """Nothing more to learn: `on_remove` already moved the key into the ghost."""

    def admit(self, key: Hashable, info: AccessInfo) -> bool:
        """Admit when the block's class at age 0 scores at least as high as the next victim."""
        if not self._is_full() or self._guard.following(self._now):
            return True
        cls = self._pending_class(key, info)
        best = self._best_victim(())
        if best is None:
            return True
        victim_score, _ = best
        return self._scores[cls][0] >= self._strictness * victim_score

    def _pending_class(self, key: Hashable, info: AccessInfo) -> int:
        """The class `on_miss` gave `key`, or a never-seen block's class when it was not the last miss."""
        if self._pending is not None:
            pending_key, cls, _ = self._pending
            if pending_key == key:
                return cls
        return _class_of(0, info.is_partial)

    def _is_full(self) -> bool:
        if self._capacity is not None:
            return len(self._where) >= self._capacity
        return self._full

    # -- EvictionPolicy ----------------------------------------------------------------------
    def on_insert(self, key: Hashable, info: AccessInfo) -> None:
        if key in self._where:  # re-put of a resident chunk: a touch, not a second copy
            self.on_access(key, info)
            return
        if self._pending is None or self._pending[0] != key:  # (key, cls, state)
            self.on_miss(key, info)  # a caller without admission: the insert is the miss
        assert self._pending is not None
        (_, cls, state), self._pending = self._pending, None
        ghost = self._ghost.pop(key, None)
        if ghost is not None:
            self._flag_counts[ghost.evicted] -= 1
        self._place(key, cls, state)
        self._close_if_done()

    def _place(self, key: Hashable, cls: int, state: int) -> None:
        self._where[key] = Resident(cls, state)
        self._lists[cls][key] = self._now

    def on_access(self, key: Hashable, info: AccessInfo) -> None:
        self._close_if_done()
        resident = self._where.get(key)
        if resident is None:
            return
        self._now += 1
        self._guard.touch(key, True, self._size())
        since = self._lists[resident.cls].pop(key)
        self._observe_reuse(resident.cls, since)
        state = resident.state + 1
        self._place(key, _class_of(state, info.is_partial), state)
        self._note_request(key, True, info)
        self._close_if_done()

    def on_remove(self, key: Hashable) -> None:
        resident = self._where.pop(key, None)
        if resident is None:
            return
        since = self._lists[resident.cls].pop(key)
        self._full = True
        self._remember(key, resident.cls, resident.state, since, evicted=True)

    def _note_request(self, key: Hashable, seen: bool, info: AccessInfo) -> None:
        """Collect one request's blocks (touched tail first); at its head, give new blocks a turn."""
        if info.position == info.chain_chunks - 1 or not self._request:
            self._request = []
        self._request.append((info.position, key, seen, info.is_partial))
        self._head_seen = info.position == 0  # close once the head is placed (or on the next call)

    def _close_if_done(self) -> None:
        if self._head_seen:
            self._head_seen = False
            self._close_request()

    def _close_request(self) -> None:
        self._guard.close_request(self._now, self._horizon)
        blocks = sorted(self._request)
        self._request = []
        base = 0
        for _, key, seen, _ in blocks:  # the turn of the deepest block of the leading run seen before
            if not seen:
                break
            base = _turn(self._state(key))
        turn = min(base + 1, MAX_TURN) << TURN_SHIFT
        for _, key, seen, partial in reversed(blocks):  # tail first: keeps the tail the older
            if not seen:
                self._set_state(key, _touches(self._state(key)) | turn, partial)

    # -- policy selection against a shadow LRU ----------------------------------------------------
    @property
    def mode(self) -> str:
        """`lru` while the cache follows LRU (evicts the oldest block, admits all), else `pace`."""
        return "lru" if self._guard.following(self._now) else "pace"

    def _state(self, key: Hashable) -> int:
        if key in self._where:
            return self._where[key].state
        ghost = self._ghost.get(key)
        return ghost.state if ghost is not None else self._memory.get(key, 0)

    def _set_state(self, key: Hashable, state: int, partial: bool) -> None:
        cls = _class_of(state, partial)
        if key in self._where:
            since = self._lists[self._where[key].cls].pop(key)
            self._where[key] = Resident(cls, state)
            self._lists[cls][key] = since
        elif key in self._ghost:
            old = self._ghost[key]
            self._ghost[key] = GhostEntry(cls, state, old.since, old.evicted)
        elif key in self._memory:
            self._memory[key] = state

    def victims(self, n: int, pinned: Container[Hashable] = ()) -> list[Hashable]:
        iters = {cls: iter(lst.items()) for cls, lst in enumerate(self._lists) if lst}
        heads = {cls: self._next_free(it, pinned) for cls, it in iters.items()}
        out: list[Hashable] = []
        while len(out) < n:
            best = self._pick(heads)
            if best is None:
                break
            _, cls = best
            head = heads[cls]
            assert head is not None
            key, _ = head
            out.append(key)
            heads[cls] = self._next_free(iters[cls], pinned)
        return out

    def _best_victim(self, pinned: Container[Hashable]) -> Candidate | None:
        return self._pick({cls: self._next_free(iter(lst.items()), pinned) for cls, lst in enumerate(self._lists) if lst})

    def _pick(self, heads: dict[int, ClassHead | None]) -> Candidate | None:
        now, table = self._now, BUCKET_OF_AGE  # _age_bucket inlined below: the inner loop of victims()
        if self._guard.following(now):  # following LRU: the class whose head is oldest
            oldest = min(((since, cls) for cls, (_, since) in self._live(heads)), default=None)
            if oldest is None:
                return None
            since, cls = oldest
            return self._scores[cls][_age_bucket(now - since)], cls
        best: Candidate | None = None
        best_score = 0.0
        for cls, head in heads.items():
            if head is None:
                continue
            _, since = head
            age = now - since
            score = self._scores[cls][table[age] if age < TABLE_AGES else bucket(age)]
            if best is None or score < best_score:
                best, best_score = (score, cls), score
        return best

    @staticmethod
    def _live(heads: dict[int, ClassHead | None]) -> Iterator[tuple[int, ClassHead]]:
        return ((cls, head) for cls, head in heads.items() if head is not None)

    @staticmethod
    def _next_free(it: Iterator[tuple[Hashable, int]], pinned: Container[Hashable]) -> ClassHead | None:
        for key, since in it:
            if key not in pinned:
                return key, since
        return None

    # -- estimation ----------------------------------------------------------------------------
    def _refresh_scores(self) -> None:
        horizon = self._update_horizon()
        # a block aged a in bucket b (a >= 2**(b-1)) is reused "soon" if reused by age a + T
        ends = [bucket(bucket_floor(b) + horizon) for b in range(NUM_BUCKETS)]
        alive = self._open_episodes()
        total_reuse = [sum(row[b] for row in self._reuse) for b in range(NUM_BUCKETS)]
        total_end = [sum(row[b] for row in self._end) for b in range(NUM_BUCKETS)]
        total_alive = [sum(row[b] for row in alive) for b in range(NUM_BUCKETS)]
        prior = row_scores(total_reuse, total_end, ends, None, horizon, total_alive)
        self._scores[PARTIAL_CLASS] = row_scores(self._reuse[0], self._end[0], ends, prior, horizon, alive[0])
        for touches in range(MAX_TOUCH + 1):  # smooth turn classes toward their touch class
            members = range(1 + touches * MAX_TURN, 1 + (touches + 1) * MAX_TURN)
            reuse = [sum(self._reuse[c][b] for c in members) for b in range(NUM_BUCKETS)]
            end = [sum(self._end[c][b] for c in members) for b in range(NUM_BUCKETS)]
            open_ = [sum(alive[c][b] for c in members) for b in range(NUM_BUCKETS)]
            touch_prior = row_scores(reuse, end, ends, prior, horizon, open_)
            for cls in members:
                self._scores[cls] = row_scores(self._reuse[cls], self._end[cls], ends, touch_prior, horizon,
                                               alive[cls])

    def _update_horizon(self) -> int:
        """Touches until the cache turns over once at the current insert rate (smoothed)."""
        inserts, now = self._inserts - self._inserts_at_refresh[0], self._now - self._inserts_at_refresh[1]
        self._inserts_at_refresh = (self._inserts, self._now)
        if inserts > 0 and now > 0:
            self._horizon += (self._size() * now / inserts - self._horizon) / 8.0
        return int(self._horizon)

    def _open_episodes(self) -> list[list[float]]:
        """Blocks resident or in the ghost (not reused since their last touch) by class and current
        age bucket: the right-censored episodes `row_scores` charges for the time they have waited."""
        now, table = self._now, BUCKET_OF_AGE  # _age_bucket inlined in both loops: they visit every block
        alive = [[0.0] * NUM_BUCKETS for _ in range(NUM_CLASSES)]
        for cls, lst in enumerate(self._lists):
            row = alive[cls]
            for since in lst.values():
                age = now - since
                row[table[age] if age < TABLE_AGES else bucket(age)] += 1.0
        for ghost in self._ghost.values():
            age = now - ghost.since
            alive[ghost.cls][table[age] if age < TABLE_AGES else bucket(age)] += 1.0
        return alive

    def __len__(self) -> int:
        return len(self._where)
