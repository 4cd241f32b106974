"""Adaptive (`adaptive`): follow the expert (LRU, S3-FIFO, two hazard variants) that the shadows show winning.

::

    every access ──> driver: a key-only copy of the leading expert, full size ── its evictions
          │                                                                    are the cache's
          ├─ full-size LRU (the driver itself while LRU leads): LRU's hits, exactly
          └─ if hash(key) is sampled (rate r) ──> shadow S3-FIFO | hazard-r | hazard, r x capacity
                        (run once per request)      hits per request -> lead over the leader

Only the leader runs at full size: the "driver", whose content the cache keeps (a key the driver
drops or refuses is the next victim, so between switches the cache is exactly the leader's).
LRU, the most frequent winner and the simplest, also runs at full size all the time: its lead
over the leader is counted exactly (its hits minus the driver's), a switch to it hands over its
own state (nothing lost), and a switch to another expert seeds that one in true recency order.
The other experts are scored on a spatial hash sample of the keys (set dueling / SHARDS: a
sample replayed through a cache scaled by the same rate has about the full cache's hit rate),
r = SAMPLE_KEYS / capacity within [MIN_RATE, MAX_RATE], raised so that a shadow holds at least
MIN_SHADOW keys (at 1% of a short trace a 13-key shadow is noise); LRU's sampled hits are the
full LRU's hits on the sampled keys. A request's sampled keys go through the shadows when the
request closes (its head, position 0, comes last), one loop per shadow.

Guard: per request (a request's blocks hit or miss together, so the request is the sample) each
expert's lead over the leader is summed with decay (a window of WINDOW capacities of accesses,
at least MIN_WINDOW), with its square. After a burn-in of BURN_IN capacities, the cache switches
to a challenger whose lead exceeds LEAD_Z standard errors and MIN_LEAD hits (sampled hits; LRU's
exact ones), the largest lead in sampled hits first. A switch to an expert other than LRU costs
that expert's lost history (ghosts, frequencies, ARC's target): a heuristic bound through rare,
significant switches, not a proof. The ARC expert does not admit a prompt's partly filled last
block (its key never comes back), as 2Q does not. The hazard experts (_expert_hazard.py) rank
reuse classes by rate / age; the cache starts on `hazard`, which leads on the chat traces.

Memory per tracked key: the resident-key dict, the driver (S3-FIFO about 2.9 entries per key
with ghost and frequency, hazard up to 4: its `where` dict, its class lists and a ghost of 2
capacities, each list entry a key and a stamp, dead entries compacted away), the full-size LRU
(a dict and a stamped list, shared with the driver while LRU leads) and three shadows of
r x capacity keys. Measured with tracemalloc on the conversation trace, the policy's objects after
the replay over its capacity: 987 bytes per resident key at 5% and 1054 at 25% (driver hazard;
with OrderedDicts before the stamped lists 875 and 918); LRU 193-206. Earlier rounds (policy plus
the replay's resident set): round 2 (2Q/LRU drivers) 646 and 365; round 1 ARC 206-297, S3-FIFO
305-325, pace 1181-1223.
At sampling rate 1 (capacity <= MIN_SHADOW) the leader's shadow is not run until the first switch:
it would replay the driver's accesses exactly, so the driver's hits stand in for it and the driver
becomes that shadow at the switch.

Speed (`kvstore bench replay_speed`, best of 3 per capacity, pooled over 1-25%, quiet machine, load
about 1 on 2 cores; docs/bench/replay_speed.json, replay_speed-run2.json, replay_speed-run3.json):
compiled with mypyc (`policies.eviction._native`; lru, arc and s3fifo are compiled alike)
0.565-0.590 x LRU's blocks/s on the conversation trace in three runs and 0.61-0.71 x on the seven
other suite workloads (before the stamped lists: 0.47-0.49 and 0.51-0.58); pure Python 0.24-0.32 x
(replay_speed-pure.json; it was 0.31-0.36: interpreted, the hazard expert's stamped lists cost more
Python steps than OrderedDict's C methods; the LRU expert keeps an OrderedDict there, _expert_lru.py).
The hazard expert alone costs about 0.65 us a block compiled (1.0 with per-class OrderedDicts;
LRU 0.15), the driver's share of the gap. What made it: the hazard classes and the full-size LRU
on StampedQueues (_fifo.py) instead of OrderedDicts, whose `popitem`/`move_to_end`/`pop` are
generic method calls under mypyc; the class rates as unboxed fields of native objects; experts
appending evictions to a `drops` list instead of calling back; the sampling hash as one wrapping
i64 multiply instead of big-int arithmetic; `in` + `del` instead of `pop(key, None)`. Every
decision is as before (victim digests identical on the suite). The replay harness (an
`AccessInfo` per access) is most of LRU's time; here the driver, the full-size LRU, the sampling
hash and the shadows add to it.
Sampling hashes the key with Python's `hash`: deterministic for int keys (replay); for str/bytes
keys it follows PYTHONHASHSEED.

Round 3 (experts LRU, S3-FIFO, hazard-r, hazard; hazard first; MIN_LEAD 16): all 32 suite cells
within 0.3 points, conversation at 5% 22.54% = 0.615 x MIN; held out (gen:FAMILY:1) 19 of 20
(scan:1 at 1% -0.37, S3-FIFO's cell, before the first switch). With MIN_LEAD 32 or 24: one cell
short on each seed (rag 5% -0.36/-0.33); ARC in place of S3-FIFO: 2 short (agent 1%, rag 5%);
ARC in place of hazard-r: 1 short on seed 0, 3 on seed 1 (rag:1, scan:1).
Round 2 (experts LRU, ARC, S3-FIFO, 2Q): with LEAD_Z 2, S3-FIFO first
and MIN_SHADOW 64, all 32 cells are within 0.3 points of the best of LRU, ARC and S3-FIFO; with
LEAD_Z 3 (6 cells short), MIN_LEAD 16 (8 short), ARC first (2 short: rag and scan at 1%),
MIN_SHADOW 0 (chat at 1% short by 0.56) it misses. Round 1 (no full-size LRU, sampled LRU,
rate up to 1/2) swept LEAD_Z, MIN_LEAD, BURN_IN, MIN_WINDOW, SAMPLE_KEYS and the first expert
and missed 7 cells at best.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Container, Hashable
from typing import TYPE_CHECKING, ClassVar, Final

from policies.eviction._expert_lru import LRU
from policies.eviction._experts import EXPERTS, Expert, access_all
from policies.eviction.base import AccessInfo
from policies.eviction.registry import register_eviction_policy

if TYPE_CHECKING:  # a type only: mypyc compiles an i64 as a C int64_t (wrapping), Python runs it as an int
    from mypy_extensions import i64

logger = logging.getLogger(__name__)

DEFAULT_EXPERTS = ("lru", "s3fifo", "hazard-r", "hazard")
SAMPLE_KEYS = 512  # shadow size the sampling rate aims for
MIN_RATE = 1 / 16  # the sampling rate's floor (evidence at large capacities) ...
MAX_RATE = 0.25  # ... and its ceiling (cost at small ones) ...
MIN_SHADOW = 64  # ... unless a shadow would hold fewer keys than this
LEAD_Z = 2.0  # switch when an expert's lead over the leader exceeds this many standard errors ...
MIN_LEAD = 16.0  # ... and this many sampled hits
WINDOW = 4.0  # decay window of the lead, in capacities of block accesses ...
MIN_WINDOW = 16384  # ... and at least this many
BURN_IN = 2.0  # no switch before this many capacities of block accesses (all shadows start cold)
FIRST = "hazard"
EXACT_SCALE = 1.0
MAX_REQUEST: Final = 4096  # a request closes at its head (position 0) or after this many touches
_HASH_MULT: Final = 0x9E3779B97F4A7C15 - (1 << 64)  # as a signed 64-bit int (the sampling hash, below)


class AdaptiveEvictionPolicy:
    """Follows the best expert on sampled shadows (see the module docstring).

    Args:
        capacity: blocks the tier holds; None: the largest resident count seen.
        experts: expert names from `policies.eviction._experts.EXPERTS`.
        first: the expert followed until another one leads.
    """

    name: ClassVar[str] = "adaptive"

    def __init__(self, capacity: int | None = None, experts: tuple[str, ...] | None = None,
                 first: str | None = None) -> None:
        self._fixed_capacity = capacity
        self._capacity = max(1, capacity or 1)
        self._names = tuple(experts or DEFAULT_EXPERTS)
        rate = max(MIN_RATE, min(MAX_RATE, SAMPLE_KEYS / self._capacity)) if capacity else 1 / 8
        rate = min(1.0, max(rate, MIN_SHADOW / self._capacity))  # tiny shadows are noise
        self._threshold = int(rate * (1 << 16))
        self._rate = self._threshold / (1 << 16)
        self._shadows: list[Expert | None] = [  # LRU's sampled hits come from the full-size LRU
            None if n == "lru" else EXPERTS[n](self._shadow_capacity()) for n in self._names]
        self._request_lru_hits = 0
        first = first or FIRST
        self._leader = self._names.index(first)
        self._lru = LRU(self._capacity)  # full size: LRU is scored exactly, and a switch to it is free
        self._lru_index = self._names.index("lru") if "lru" in self._names else -1
        self._request_exact = 0  # this request's LRU hits minus the leader's (full size)
        self._driver: Expert = self._lru if first == "lru" else EXPERTS[first](self._capacity)
        # Every key sampled (rate 1): until the first switch the leader's shadow would replay the
        # driver's accesses exactly, so the driver's hits stand in for it, and at the switch the
        # driver becomes that shadow (`_switch`). Same decisions, one full-size cache less.
        self._twin = capacity is not None and self._threshold >= 1 << 16 and self._leader != self._lru_index
        if self._twin:
            self._shadows[self._leader] = None
        self._request_driver_hits = 0  # this request's driver hits (the twin's hits)
        self._drops: list[Hashable] = []  # the driver's evictions since the last access
        self._driver.drops = self._drops
        self._resident: dict[Hashable, None] = {}
        self._orphans: OrderedDict[Hashable, None] = OrderedDict()  # resident, not held by the driver
        self._no_hits = [0] * len(self._names)
        self._request_keys: list[Hashable] = []  # this request's sampled keys and partial flags,
        self._request_partial: list[bool] = []  # run through the shadows when the request closes
        self._request_touches = 0
        self._touches = 0
        self._lead = [0.0] * len(self._names)
        self._lead_sq = [0.0] * len(self._names)
        self._pending: Hashable | None = None
        self.switches = 0
        self._quiet_until = BURN_IN * self._capacity  # no switch before (block accesses)

    @property
    def mode(self) -> str:
        """The expert the cache follows now."""
        return self._names[self._leader]

    def _shadow_capacity(self) -> int:
        return max(1, round(self._capacity * self._rate))

    # -- the access stream (inlined in on_insert / on_access: the replay's hot path) -----------
    def _adopt_drops(self) -> None:
        """Keys the driver dropped that are resident become the next victims."""
        resident, orphans = self._resident, self._orphans
        for key in self._drops:
            if key in resident:
                orphans[key] = None
        self._drops.clear()

    def on_miss(self, key: Hashable, info: AccessInfo) -> None:
        """Run the miss through driver and shadows; `admit` then asks whether the driver kept it."""
        if key in self._resident:
            return
        self._touch(key, info)
        self._pending = key

    def admit(self, key: Hashable, info: AccessInfo) -> bool:
        """Admit what the driver holds (it may refuse, e.g. 2Q a prompt's partly filled last block)."""
        return len(self._resident) < self._capacity or self._pending != key or key in self._driver

    def _touch(self, key: Hashable, info: AccessInfo) -> None:
        driver = self._driver
        partial = info.is_partial
        hit = driver.access(key, partial)
        lru = self._lru
        if lru is driver:
            lru_hit = hit
        else:  # LRU's exact lead over the leader
            lru_hit = lru.access(key, partial)
            self._request_exact += lru_hit - hit
        if self._drops:
            self._adopt_drops()
        orphans = self._orphans
        if orphans and key in orphans and key in driver:
            del orphans[key]
        # bits 48-63 of hash(key) * 0x9E3779B97F4A7C15 mod 2**64: one machine multiply compiled
        # (an i64 wraps), the same bits from Python's unbounded ints in pure Python
        h: i64 = hash(key)
        if (h * _HASH_MULT >> 48) & 0xFFFF < self._threshold:
            self._request_keys.append(key)
            self._request_partial.append(partial)
            self._request_lru_hits += lru_hit
            self._request_driver_hits += hit
        self._request_touches += 1
        if info.position == 0 or self._request_touches >= MAX_REQUEST:  # the cache touches a request's head last
            self._close_request()

    # -- EvictionPolicy ------------------------------------------------------------------------
    def on_insert(self, key: Hashable, info: AccessInfo) -> None:
        resident = self._resident
        if key in resident:  # re-put of a resident chunk: a touch, not a second copy
            self._touch(key, info)
            return
        driver = self._driver
        pending = self._pending
        if pending is not key and pending != key:  # identity first: the replay passes the same object
            self._touch(key, info)
        self._pending = None
        resident[key] = None
        if self._fixed_capacity is None and len(resident) > self._capacity:
            self._grow(len(resident))
        if key not in driver:
            self._orphans[key] = None
            self._orphans.move_to_end(key, last=False)  # refused by the driver: the first victim

    def _grow(self, capacity: int) -> None:
        self._capacity = capacity
        self._driver.resize(capacity)
        self._lru.resize(capacity)
        for shadow in self._shadows:
            if shadow is not None:
                shadow.resize(self._shadow_capacity())

    def on_access(self, key: Hashable, info: AccessInfo) -> None:
        if key in self._resident:
            self._touch(key, info)

    def on_remove(self, key: Hashable) -> None:
        resident, orphans = self._resident, self._orphans
        if key in resident:  # `in` + `del`: native under mypyc, where `pop(key, None)` is a method call
            del resident[key]
        if key in orphans:
            del orphans[key]

    def victims(self, n: int, pinned: Container[Hashable] = ()) -> list[Hashable]:
        if n == 1:  # the common case: the oldest key the driver dropped (orphans are resident)
            for key in self._orphans:
                if key not in pinned:
                    return [key]
        out: list[Hashable] = []
        chosen: set[Hashable] = set()
        resident = self._resident
        for candidates in (self._orphans, self._driver.order(), resident):
            for key in candidates:
                if len(out) >= n:
                    return out
                if key in resident and key not in pinned and key not in chosen:
                    out.append(key)
                    chosen.add(key)
        return out

    def __len__(self) -> int:
        return len(self._resident)

    # -- the guard -----------------------------------------------------------------------------
    def _close_request(self) -> None:
        keep = max(0.0, 1.0 - self._request_touches / max(MIN_WINDOW, WINDOW * self._capacity))
        keys, partial = self._request_keys, self._request_partial
        if keys:
            lru_hits, self._request_lru_hits = self._request_lru_hits, 0
            twin_hits, self._request_driver_hits = self._request_driver_hits, 0
            hits = [access_all(shadow, keys, partial) if shadow is not None
                    else lru_hits if i == self._lru_index else twin_hits for i, shadow in enumerate(self._shadows)]
        else:
            hits = self._no_hits
        keys.clear()
        partial.clear()
        lead, lead_sq = self._lead, self._lead_sq
        base = hits[self._leader]
        exact, self._request_exact = self._request_exact * EXACT_SCALE, 0
        for i in range(len(hits)):
            d = exact if i == self._lru_index else hits[i] - base
            lead[i] = lead[i] * keep + d
            lead_sq[i] = lead_sq[i] * keep + d * d
        self._touches += self._request_touches
        self._request_touches = 0
        if self._touches >= self._quiet_until:
            best = self._challenger()
            if best >= 0:
                self._switch(best)

    def _challenger(self) -> int:
        """The expert whose lead over the leader is significant (LEAD_Z, MIN_LEAD) and largest in
        sampled hits (LRU's exact lead counts at the sampling rate); -1: none."""
        lead, lead_sq = self._lead, self._lead_sq
        best, best_score = -1, 0.0
        for i in range(len(lead)):
            if i != self._leader and lead[i] > MIN_LEAD and lead[i] ** 2 > LEAD_Z ** 2 * lead_sq[i]:
                score = lead[i] * (self._rate if i == self._lru_index else 1.0)
                if score > best_score:
                    best, best_score = i, score
        return best

    def _switch(self, index: int) -> None:
        old, resident = self._driver, self._resident
        lru = self._lru
        lru.drops = None
        if self._twin:  # the driver has replayed what the leader's shadow would have: it becomes that shadow
            old.drops = None
            self._shadows[self._leader] = old
            self._twin = False
        if index == self._lru_index:  # the full-size LRU holds LRU's content: the switch loses nothing
            driver: Expert = lru
        else:  # seeded in recency order (resident keys LRU no longer holds are the oldest)
            keys = [k for k in resident if k not in lru] + [k for k in lru.order() if k in resident]
            driver = EXPERTS[self._names[index]](self._capacity)
            driver.seed(keys, old.reused())
        driver.drops = self._drops
        self._driver, self._leader = driver, index
        self._orphans = OrderedDict((k, None) for k in resident if k not in driver)
        self._lead = [0.0] * len(self._names)
        self._lead_sq = [0.0] * len(self._names)
        self.switches += 1
        logger.debug("adaptive: following %s (switch %d)", self._names[index], self.switches)


register_eviction_policy(AdaptiveEvictionPolicy)  # a statement, not a decorator: mypyc compiles only undecorated classes natively
