"""PACE (`pace`): prefix-aware eviction and admission by per-class reuse probability learned online.

Why: in prefix-cached KV traffic most blocks are used once (a conversation that does not come
back, a prompt's partly filled last block), and they push out the blocks that will be reused.
With perfect reuse labels LRU is optimal on such traffic, so the whole game is predicting reuse.
PACE predicts it from what the cache itself observes, with no trace-specific constants:

* Each block, at each touch, falls in a class: how often it has been touched (0, 1, 2, 3+, kept
  across evictions by a ghost list) x its chain's turn count (1 + the turn of the deepest block
  of the request that was seen before, 1..4+; assigned when the request's head is touched, the
  last call for a request), or the "partly filled last block" class.
* Touch memory (`MEMORY_FACTOR`): when the ghost forgets a key, its episode ends (see below) but
  its touch/turn state moves to a key -> int list of another 1.5 capacities. A miss on such a key
  is not a reuse for the statistics (the episode was already closed as an "end", and the ghost's
  strictness feedback ignores it), it only keeps the block's touch count and turn: a block that
  comes back after a long gap enters as a seen block of its old class, not as a new one. At 1%
  many conversations return from beyond the ghost's reach, so without this such returning
  blocks looked new (conversation trace at 1/5/10/25%: 9.92/22.40/29.53/35.41% block hits, was
  8.78/22.18/29.58/35.41). Simply enlarging the ghost to 2-4 capacities gained 0.4-1.2 points
  at 1% but cost 0.07-0.11 at 10% (and 1.75 lost 0.25 at 5%), apparently because its long-age
  reuses made old blocks look worth keeping: the same 3 capacities as ghost plus memory, with the
  memory's hits counted as reuses, gave 29.48% at 10%; keeping them out of the statistics, 29.53%.
* For every class the policy keeps age histograms in logical time (block touches): `reuse[c][b]`
  counts re-touches at age bucket b (resident and ghost hits alike), `end[c][b]` blocks the ghost
  forgot at age b without a re-touch. A block of class c that has survived to age a scores its
  expected reuses per touch of cache time over the horizon T (touches for the cache to turn over
  at the current miss rate): reuses in ages [a, a+T] over the cache time they and the others
  would occupy. Sparse classes are pulled toward their touch class, which is pulled toward all.
* Open episodes are right-censored, not ignored: at each score refresh the blocks still resident
  or in the ghost (not reused since their last touch) are counted by class and current age, and
  each adds the time it has waited so far (up to T) to its class's cache time, with no reuse. A
  block's "end" is only recorded when the ghost forgets it, one ghost length after eviction; with
  a large cache that is most of a trace, and until then a class was scored from its reused blocks
  alone: old blocks looked far likelier to come back than they were, and PACE evicted fresh
  blocks of the running request for them (at 25% on the conversation trace: 26k such evictions,
  6k of them reused while LRU would still have held them).
* Eviction: an LRU list per class; the victim is the oldest block of the class whose score at
  that block's age is lowest. The cache touches a request's tail before its head, so within a
  class a chain's tail is older and goes first.
* Admission: a missed block enters when its class's score at age 0 is at least `strictness` x
  the next victim's score. Partly filled blocks learn a near-zero score and are skipped; at small
  capacities never-seen blocks lose to the ghost-seen ones (ghost-gated admission, learned).
  `strictness` adapts like ARC's target: a ghost hit on a denied block lowers it, one on an
  evicted block raises it, each scaled by the other kind's share of the ghost. Like ARC's target
  it starts at 0 (admit everything) and only becomes strict when evicted blocks keep coming back
  (starting strict, 1.0, denied too much at small capacities and left holes in chains). Denied
  blocks enter the ghost too, so the policy keeps learning about them.
* Guard against LRU (`_lru_guard.py`): a key-only shadow LRU of the same size sees the same touches (O(capacity)
  keys, like a ghost list). Per request (a request's blocks hit or miss together, so the
  request, not the block, is the independent sample) the lead is the shadow's hits minus ours;
  decayed sums of leads and of their squares over about one horizon of touches give a
  self-normalised test. When the lead exceeds LRU_LEAD_Z standard errors the cache follows LRU
  for LRU_STINT horizons: it evicts the globally oldest block (the oldest class head; tail before
  head still holds) and admits every block. Then it runs PACE again with a fresh window: while
  following LRU the shadow and the cache agree, so there is nothing to compare, and a policy that
  stayed on LRU would never come back. The learning (histograms, horizon, strictness) goes on in
  both modes. This catches phases where the class estimates are wrong (a workload shift; the
  first turnovers of a large cache) at the price of a half-turnover stint when the test fires on
  a short-lived lead.

Constants are structural (4 age buckets per octave, ghost of 1.5 capacities, touch memory of
1.5 more, pseudo-count 32, strictness step 0.01; guard: 2 standard errors, window of 1 horizon,
stint of 0.5 horizon). The touch memory's size was picked from {1.5, 4} on the conversation trace,
its halves and the synthetic traces: 4 did a little better at 1% but cost 0.07 points at 10% on
the trace (29.50%); checked afterwards, 1 and 2 also gain at 1% (trace: 9.34%, 10.11%). The
ghost size and pseudo-count were picked by sweeps on the conversation trace ({1, 1.5, 2, 4, 8,
16} and {2, 8, 16, 32, 64}), before the censoring and the guard existed; the ghost size was the
most sensitive (a larger ghost helped at 1% and hurt at 5-10%). The guard's constants were
picked from z in {2, 3}, window in {0.5, 1, 2} and stint in {0.25, 0.5, 1} horizons on that
trace, its two halves and four ad hoc synthetic conversation traces (not in the repo): with
z = 3 it never fires on the trace (25%: 35.28% block hits, below LRU's 35.35%); with z = 2 the
nine window/stint pairs give 35.33-35.42% there (below LRU only with the shortest window and
stint, 0.5 and 0.25); a stint of 1 horizon cost 0.23 points on the trace's second half at 25%
(29.19% vs 29.42%, a false alarm that lasted), 0.25-0.5 cost at most 0.01.

Known weaknesses: the guard only reacts. It needs a horizon of evidence and gives up after each
stint, so in a phase where LRU is better PACE recovers only part of the difference (the shift
test in tests/policies/test_pace_selection.py: 1196 hits vs LRU's 1496, 1133 without the guard),
and at 25% on the conversation trace PACE's margin over LRU rests on it (35.41% vs 35.35%; 35.28%
without it). On four synthetic conversation traces at 1% the touch memory moved PACE by -0.10
to +0.54 points (A 30.04 -> 30.58%, B 30.20 -> 30.61, C 22.59 -> 23.07, D 21.10 -> 21.00), but
ARC still beats it on C (23.24%) and LFU ties it on D (21.00%); at 5% it moved them by -0.18 to
+0.60 (B 48.74 -> 48.56), at 10% by +0.03 to +0.14. On the conversation trace's halves it gained
0.41 at 1%, 0.73 at 5% and 0.21 at 10% on the first (6.09%, 16.42%, 22.13%) and 1.16 at 5% on
the second (15.65%), but lost 0.18 at 1% (5.87% vs 6.05%; 6.21% before the censoring, which cost
0.16 at 1% and gained up to 2.6 at 25%) and 0.06 at 10% (20.58%) there. At 10% on the full trace
it is 0.04 points below the version without it (29.53% vs 29.58%).

Args of `PACEEvictionPolicy`: `capacity` (blocks the tier holds; None: inferred, the cache is
"full" once it has evicted), `ghost_factor` (ghost size in capacities).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Container, Hashable, Iterator

from policies.eviction._age_stats import BUCKET_OF_AGE, NUM_BUCKETS, TABLE_AGES, bucket, bucket_floor, row_scores
from policies.eviction._lru_guard import LRUGuard
from policies.eviction.base import AccessInfo
from policies.eviction.registry import register_eviction_policy

logger = logging.getLogger(__name__)

MAX_TOUCH = 3
MAX_TURN = 4
PARTIAL_CLASS = 0
ADMISSION_STEP = 0.01  # per missed reuse, ARC-style, scaled by the ghost's mix of denied/evicted keys
MAX_STRICTNESS = 4.0
NUM_CLASSES = 1 + (MAX_TOUCH + 1) * MAX_TURN
TURN_SHIFT = 16  # a block's state packs touches (low bits) and its chain's turn count
MEMORY_FACTOR = 1.5  # capacities of keys the ghost forgot whose touch/turn state is still kept


def _class_of(state: int, is_partial: bool) -> int:
    if is_partial:
        return PARTIAL_CLASS
    touches, turn = state & ((1 << TURN_SHIFT) - 1), state >> TURN_SHIFT
    return 1 + min(touches, MAX_TOUCH) * MAX_TURN + max(0, min(turn, MAX_TURN) - 1)


@register_eviction_policy
class PACEEvictionPolicy:
    """Prefix-aware, class-based reuse estimation; eviction and admission (see module docstring)."""

    name = "pace"

    def __init__(self, capacity: int | None = None, ghost_factor: float = 1.5) -> None:
        self._capacity = capacity
        self._ghost_factor = ghost_factor
        self._now = 0
        self._lists: list[OrderedDict[Hashable, int]] = [OrderedDict() for _ in range(NUM_CLASSES)]
        self._where: dict[Hashable, tuple[int, int]] = {}  # resident key -> (class, touches)
        self._ghost: OrderedDict[Hashable, tuple[int, int, int, bool]] = OrderedDict()  # key -> (class, state, time, evicted)
        self._memory: OrderedDict[Hashable, int] = OrderedDict()  # key the ghost forgot -> state
        self._reuse = [[0.0] * NUM_BUCKETS for _ in range(NUM_CLASSES)]
        self._end = [[0.0] * NUM_BUCKETS for _ in range(NUM_CLASSES)]
        self._scores = [[0.5] * NUM_BUCKETS for _ in range(NUM_CLASSES)]
        self._horizon = float(capacity or 1024)
        self._events = 0
        self._full = False
        self._pending: tuple[Hashable, int, int] | None = None
        self._inserts = 0
        self._strictness = 0.0  # start permissive, as ARC's target starts at 0
        self._flag_counts = {False: 0, True: 0}  # ghost entries: denied (False) / evicted (True)
        self._request: list[tuple[int, Hashable, bool, bool]] = []
        self._head_seen = False
        self._inserts_at_refresh = (0, 0)
        self._guard = LRUGuard()  # a key-only LRU of the same size over the same touches

    # -- bookkeeping ------------------------------------------------------------------------
    def _observe_reuse(self, cls: int, since: int) -> None:
        self._reuse[cls][bucket(self._now - since)] += 1.0
        self._tick()

    def _tick(self) -> None:
        self._events += 1
        interval = max(256, (self._capacity or len(self._where) or 1) // 4)
        if self._events % interval == 0:
            self._refresh_scores()
        if self._events % (64 * interval) == 0:
            for table in (self._reuse, self._end):
                for row in table:
                    row[:] = [v * 0.5 for v in row]

    def _ghost_limit(self) -> int:
        return max(16, int((self._capacity or len(self._where) or 1) * self._ghost_factor))

    def _remember(self, key: Hashable, cls: int, touches: int, since: int, evicted: bool = False) -> None:
        self._memory.pop(key, None)
        old = self._ghost.get(key)
        if old is not None:
            self._flag_counts[old[3]] -= 1
        self._flag_counts[evicted] += 1
        self._ghost[key] = (cls, touches, since, evicted)
        self._ghost.move_to_end(key)
        while len(self._ghost) > self._ghost_limit():
            old_key, (old_cls, old_state, old_since, old_flag) = self._ghost.popitem(last=False)
            self._flag_counts[old_flag] -= 1
            self._end[old_cls][bucket(self._now - old_since)] += 1.0
            self._memory[old_key] = old_state  # the episode ends here; the touch count lives on
        memory_limit = int((self._capacity or len(self._where) or 1) * MEMORY_FACTOR)
        while len(self._memory) > memory_limit:
            self._memory.popitem(last=False)

    def on_miss(self, key: Hashable, info: AccessInfo) -> None:
        """Record the miss: a ghost hit is an observed reuse; the key (re)enters the ghost."""
        self._close_if_done()
        self._now += 1
        touches = 0
        entry = self._ghost.pop(key, None)
        if entry is not None:
            # a reuse the cache missed: blame eviction (be stricter) or admission (be laxer)
            self._flag_counts[entry[3]] -= 1
            denied, evicted = self._flag_counts[False] + 1, self._flag_counts[True] + 1
            step = ADMISSION_STEP * denied / evicted if entry[3] else -ADMISSION_STEP * evicted / denied
            self._strictness = min(MAX_STRICTNESS, max(0.0, self._strictness + step))
            self._observe_reuse(entry[0], entry[2])
            touches = entry[1] + 1
        remembered = self._memory.pop(key, None) if entry is None else None
        if remembered is not None:  # not a reuse for the statistics (its episode has ended)
            touches = remembered + 1
        self._guard.touch(key, False, self._capacity or len(self._where) or 1)
        cls = _class_of(touches, info.is_partial)
        self._remember(key, cls, touches, self._now)
        self._pending = (key, cls, touches)
        self._inserts += 1  # misses, admitted or not: the horizon must not depend on admission
        self._note_request(key, entry is not None or remembered is not None, info)

    def on_evict(self, key: Hashable) -> None:
        """Nothing more to learn: `on_remove` already moved the key into the ghost."""

    def admit(self, key: Hashable, info: AccessInfo) -> bool:
        """Admit when the block's class at age 0 scores at least as high as the next victim."""
        if not self._is_full() or self._guard.following(self._now):
            return True
        cls = self._pending[1] if self._pending and self._pending[0] == key else _class_of(0, info.is_partial)
        best = self._best_victim(())
        return best is None or self._scores[cls][0] >= self._strictness * best[0]

    def _is_full(self) -> bool:
        if self._capacity is not None:
            return len(self._where) >= self._capacity
        return self._full

    # -- EvictionPolicy ----------------------------------------------------------------------
    def on_insert(self, key: Hashable, info: AccessInfo) -> None:
        if key in self._where:  # re-put of a resident chunk: a touch, not a second copy
            self.on_access(key, info)
            return
        if self._pending is None or self._pending[0] != key:
            self.on_miss(key, info)  # a caller without admission: the insert is the miss
        assert self._pending is not None
        _, cls, touches = self._pending
        self._pending = None
        entry = self._ghost.pop(key, None)
        if entry is not None:
            self._flag_counts[entry[3]] -= 1
        self._place(key, cls, touches)
        self._close_if_done()

    def _place(self, key: Hashable, cls: int, touches: int) -> None:
        self._where[key] = (cls, touches)
        self._lists[cls][key] = self._now

    def on_access(self, key: Hashable, info: AccessInfo) -> None:
        self._close_if_done()
        where = self._where.get(key)
        if where is None:
            return
        self._now += 1
        self._guard.touch(key, True, self._capacity or len(self._where) or 1)
        cls, touches = where
        since = self._lists[cls].pop(key)
        self._observe_reuse(cls, since)
        touches += 1
        self._place(key, _class_of(touches, info.is_partial), touches)
        self._note_request(key, True, info)
        self._close_if_done()

    def on_remove(self, key: Hashable) -> None:
        where = self._where.pop(key, None)
        if where is None:
            return
        cls, touches = where
        since = self._lists[cls].pop(key)
        self._full = True
        self._remember(key, cls, touches, since, evicted=True)

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
        for _, key, seen, _ in blocks:
            if not seen:
                break
            base = self._state(key) >> TURN_SHIFT
        turn = min(base + 1, MAX_TURN) << TURN_SHIFT
        for _, key, seen, partial in reversed(blocks):  # tail first: keeps the tail the older
            if not seen:
                self._set_state(key, (self._state(key) & ((1 << TURN_SHIFT) - 1)) | turn, partial)

    # -- policy selection against a shadow LRU ----------------------------------------------------
    @property
    def mode(self) -> str:
        """`lru` while the cache follows LRU (evicts the oldest block, admits all), else `pace`."""
        return "lru" if self._guard.following(self._now) else "pace"

    def _state(self, key: Hashable) -> int:
        if key in self._where:
            return self._where[key][1]
        entry = self._ghost.get(key)
        return entry[1] if entry is not None else self._memory.get(key, 0)

    def _set_state(self, key: Hashable, state: int, partial: bool) -> None:
        cls = _class_of(state, partial)
        if key in self._where:
            old_cls, _ = self._where[key]
            since = self._lists[old_cls].pop(key)
            self._where[key] = (cls, state)
            self._lists[cls][key] = since
        elif key in self._ghost:
            _, _, since, evicted = self._ghost[key]
            self._ghost[key] = (cls, state, since, evicted)
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
            cls = best[1]
            out.append(heads[cls][0])  # type: ignore[index]
            heads[cls] = self._next_free(iters[cls], pinned)
        return out

    def _best_victim(self, pinned: Container[Hashable]) -> tuple[float, int] | None:
        return self._pick({cls: self._next_free(iter(lst.items()), pinned) for cls, lst in enumerate(self._lists) if lst})

    def _pick(self, heads: dict[int, tuple[Hashable, int] | None]) -> tuple[float, int] | None:
        best: tuple[float, int] | None = None
        now, table = self._now, BUCKET_OF_AGE
        if self._guard.following(now):  # following LRU: the class whose head is oldest
            oldest = min(((head[1], cls) for cls, head in heads.items() if head is not None), default=None)
            if oldest is None:
                return None
            age = now - oldest[0]
            return self._scores[oldest[1]][table[age] if age < TABLE_AGES else bucket(age)], oldest[1]
        for cls, head in heads.items():
            if head is None:
                continue
            age = now - head[1]
            score = self._scores[cls][table[age] if age < TABLE_AGES else bucket(age)]
            if best is None or score < best[0]:
                best = (score, cls)
        return best

    @staticmethod
    def _next_free(it: Iterator[tuple[Hashable, int]], pinned: Container[Hashable]) -> tuple[Hashable, int] | None:
        for key, since in it:
            if key not in pinned:
                return key, since
        return None

    # -- estimation ----------------------------------------------------------------------------
    def _refresh_scores(self) -> None:
        # the horizon: touches until the cache has turned over once at the current insert rate
        inserts, now = self._inserts - self._inserts_at_refresh[0], self._now - self._inserts_at_refresh[1]
        self._inserts_at_refresh = (self._inserts, self._now)
        size = self._capacity or len(self._where) or 1
        if inserts > 0 and now > 0:
            self._horizon += (size * now / inserts - self._horizon) / 8.0
        horizon = int(self._horizon)
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

    def _open_episodes(self) -> list[list[float]]:
        """Blocks resident or in the ghost (not reused since their last touch) by class and current
        age bucket: the right-censored episodes `row_scores` charges for the time they have waited."""
        now, table = self._now, BUCKET_OF_AGE
        alive = [[0.0] * NUM_BUCKETS for _ in range(NUM_CLASSES)]
        for cls, lst in enumerate(self._lists):
            row = alive[cls]
            for since in lst.values():
                age = now - since
                row[table[age] if age < TABLE_AGES else bucket(age)] += 1.0
        for cls, _, since, _ in self._ghost.values():
            age = now - since
            alive[cls][table[age] if age < TABLE_AGES else bucket(age)] += 1.0
        return alive


    def __len__(self) -> int:
        return len(self._where)
