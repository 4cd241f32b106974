"""Adaptive (`adaptive`): follow whichever expert (LRU, S3-FIFO, the hazard expert `hazard-a`) the scores show leading.

::

    every access ──> driver: the leading expert, key-only, full size ── its evictions are the cache's
          ├─ full-size LRU and S3-FIFO (one of them is the driver while it leads): exact hits
          │             (each runs the request's keys in one pass when it closes)
          └─ if hash(key) is sampled (rate r) ──> shadow hazard-a, r x capacity (none while it leads)
                        (run once per request)      hits per request -> lead over the leader
                        (under FULL_BELOW blocks: no sample, hazard-a at full size too;
                         over FULL_UP_TO blocks: every expert on the sample, none at full size)

Why: no one classic policy leads everywhere. LRU wins on recency-heavy traffic, S3-FIFO on
one-hit-heavy streams and scan bursts, the hazard expert (_expert_hazard.py) on multi-turn chat
and, with its age exponent learned (`hazard-a`, _expert_hazard_age.py), on Zipf-popular documents
too. So the cache keeps exactly the content of one expert, the "driver", and changes expert when
another one is measurably ahead: a key the driver drops or refuses is the next victim, so between
switches the cache is the leader's.

Scoring. LRU and S3-FIFO (FULL_SIZE) run at full size: their leads over the driver are counted
exactly, and a switch to one of them hands over its own state (a seeded S3-FIFO would lack its
ghost and frequencies). They take a request's keys in one pass when it closes, which keeps each
one's tables warm in the CPU's cache; their state at every close is the one access by access.
Under FULL_BELOW blocks every expert runs at full size (a shadow would hold a few dozen keys);
over FULL_UP_TO blocks none does, as the full-size tables would cost more than the rest of the
cache. Elsewhere hazard-a runs on a spatial hash sample of the keys (set dueling / SHARDS: a sample
replayed through a cache scaled by the same rate has about the full cache's hit rate),
r = SAMPLE_KEYS / capacity within [MIN_RATE, MAX_RATE], raised so a shadow holds at least
MIN_SHADOW keys; a request's sampled keys go through the shadows when it closes (its head,
position 0, is touched last). The driver stands in for the leader's shadow (the "twin") wherever
that shadow would only replay a sample of what the driver does: at r = 1 until the first switch,
and while no other expert is sampled (`_rest_shadow`).

Guard. A request's blocks hit or miss together, so the request is the sample: each expert's lead
over the leader is summed per request with decay (WINDOW capacities of accesses, at least
MIN_WINDOW), with its square. After BURN_IN capacities the cache switches to a challenger whose
lead exceeds MIN_LEAD sampled hits and LEAD_Z standard errors once shrunk toward zero (a full-size
expert's exact lead counts at the sampling rate), the largest first. The shrinkage: the test runs
after every request, so the lead that first passes it is picked at a peak, and on traffic whose
leads are noisy per access it reverts and the switch loses. So the lead per access is read as a
normal posterior under a prior N(0, tau^2) on the true lead, tau = PRIOR_POINTS points: its z is
the plain z times sqrt(tau^2 / (tau^2 + s^2)), s the standard error per access.

A switch builds the new driver from the old one's state, and a shadow of the old leader from the
driver's sampled keys (_handover.py). ARC is not an expert: it does not close the 1% chat cells
where it leads and would be a third full-size cache. docs/adaptive.md has the reasons for each
constant, the evidence with the command behind each figure, the memory per key and the speed.
Sampling hashes keys with Python's `hash`: deterministic for int keys (replay); for str/bytes
keys it follows PYTHONHASHSEED.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Container, Hashable
from typing import ClassVar, Final

from policies.eviction._expert_base import SAMPLE_SCALE, sample_bits
from policies.eviction._expert_lru import LRU
from policies.eviction._experts import EXPERTS, Expert, access_all
from policies.eviction._fifo import KeySet
from policies.eviction._handover import new_shadow, sample_of, seeded
from policies.eviction.base import AccessInfo
from policies.eviction.registry import register_eviction_policy

logger = logging.getLogger(__name__)

DEFAULT_EXPERTS = ("lru", "s3fifo", "hazard-a")
FULL_SIZE = ("lru", "s3fifo")  # experts that run at full size: scored exactly, handed over at a switch
SAMPLE_KEYS = 512  # shadow size the sampling rate aims for
MIN_RATE = 1 / 16  # the sampling rate's floor (evidence at large capacities) ...
MAX_RATE = 0.25  # ... and its ceiling (cost at small ones) ...
MIN_SHADOW = 64  # ... unless a shadow would hold fewer keys than this
LEAD_Z = 2.0  # switch when an expert's lead over the leader exceeds this many standard errors ...
MIN_LEAD = 16.0  # ... and this many sampled hits
PRIOR_POINTS = 1.0  # ... after shrinking the lead by a N(0, tau^2) prior on true leads per access, tau in points
WINDOW = 4.0  # decay window of the lead, in capacities of block accesses ...
MIN_WINDOW = 16384  # ... and at least this many
BURN_IN = 2.0  # no switch before this many capacities of block accesses (all shadows start cold)
FULL_UP_TO = 8192  # above this many blocks no expert runs at full size (docs/adaptive.md says why)
FULL_BELOW = SAMPLE_KEYS  # under this many blocks every expert runs at full size (a shadow would be under its target)
FIRST = "hazard-a"
EXACT_SCALE = 1.0
MAX_REQUEST: Final = 4096  # a request closes at its head (position 0) or after this many touches


class AdaptiveEvictionPolicy:
    """Follows the best expert on sampled shadows (see the module docstring).

    Args:
        capacity: blocks the tier holds; None: the largest resident count seen.
        experts: expert names from `policies.eviction._experts.EXPERTS`.
        first: the expert followed until another one leads.
        full_size: experts (among `experts`) run at full size rather than on a sample; LRU always is.
    """

    name: ClassVar[str] = "adaptive"

    def __init__(self, capacity: int | None = None, experts: tuple[str, ...] | None = None,
                 first: str | None = None, full_size: tuple[str, ...] | None = None) -> None:
        self._fixed_capacity = capacity
        self._capacity = max(1, capacity or 1)
        self._names = tuple(experts or DEFAULT_EXPERTS)
        rate = max(MIN_RATE, min(MAX_RATE, SAMPLE_KEYS / self._capacity)) if capacity else 1 / 8
        rate = min(1.0, max(rate, MIN_SHADOW / self._capacity))  # tiny shadows are noise
        self._threshold = int(rate * SAMPLE_SCALE)
        self._rate = self._threshold / SAMPLE_SCALE
        self._lru = LRU(self._capacity)  # full size up to FULL_UP_TO: it orders the keys a new expert is seeded with
        full = {"lru", *(FULL_SIZE if full_size is None else full_size)}
        if full_size is None and capacity is not None and capacity > FULL_UP_TO:
            full = set()  # large: every expert on the sample (see FULL_UP_TO)
        if full_size is None and capacity is not None and capacity < FULL_BELOW:
            full.update(self._names)  # small: every expert at full size, scored exactly, handed over whole
        # Full-size experts are scored exactly (their hits minus the driver's) and a switch to one
        # hands over its state; the others run as shadows on the sampled keys.
        self._full_index = [i for i, n in enumerate(self._names) if n in full]
        self._full: list[Expert] = [self._lru if self._names[i] == "lru" else EXPERTS[self._names[i]](self._capacity)
                                    for i in self._full_index]
        self._is_full = [n in full for n in self._names]
        if all(self._is_full):
            self._threshold = 0  # no shadow: nothing to sample
        self._request_exact = [0] * len(self._full)  # this request's hits of each minus the driver's
        self._full_keys: list[Hashable] = []  # this request's accesses, for the full-size experts
        self._full_partial: list[bool] = []
        self._full_driver_hits = 0
        self._shadows: list[Expert | None] = [
            None if self._is_full[i] else new_shadow(n, self._shadow_capacity(), self._rate)
            for i, n in enumerate(self._names)]
        first = first or FIRST
        self._leader = self._names.index(first)
        self._driver: Expert = (self._full[self._full_index.index(self._leader)] if self._is_full[self._leader]
                                else EXPERTS[first](self._capacity))
        # Where the leader's shadow would only replay a sample of the driver's accesses (every key
        # sampled, until the first switch; or no other expert sampled), the driver's hits stand in for
        # it and a switch away makes it from the driver (`_rest_shadow`, `_switch`).
        self._twin = False
        self._rest_shadow(self._leader, True)
        self._request_driver_hits = 0  # this request's driver hits (the twin's hits)
        self._drops: list[Hashable] = []  # the driver's evictions since the last access
        self._driver.drops = self._drops
        self._resident = KeySet()  # a dict of keys that come and go keeps room for three times as many
        self._orphans: OrderedDict[Hashable, None] = OrderedDict()  # resident, not held by the driver
        self._no_hits = [0] * len(self._names)
        self._request_keys: list[Hashable] = []  # this request's sampled keys and partial flags,
        self._request_partial: list[bool] = []  # run through the shadows when the request closes
        self._request_touches = 0
        self._touches = 0
        self._lead = [0.0] * len(self._names)
        self._lead_sq = [0.0] * len(self._names)
        self._weight = 0.0  # block accesses behind the leads (decayed like them)
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
        if self._full:  # the full-size experts other than the driver run this request's keys when it closes (`_run_full`)
            self._full_keys.append(key)
            self._full_partial.append(partial)
            self._full_driver_hits += hit
        if self._drops:
            self._adopt_drops()
        orphans = self._orphans
        if orphans and key in orphans and key in driver:
            del orphans[key]
        threshold = self._threshold
        if threshold and sample_bits(key) < threshold:  # threshold 0: every expert at full size, nothing sampled
            self._request_keys.append(key)
            self._request_partial.append(partial)
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
        resident.add(key)
        if self._fixed_capacity is None and len(resident) > self._capacity:
            self._grow(len(resident))
        if key not in driver:
            self._orphans[key] = None
            self._orphans.move_to_end(key, last=False)  # refused by the driver: the first victim

    def _run_full(self) -> None:
        """Run the buffered accesses through the full-size experts other than the driver: each takes
        the request's keys in one pass (its own tables stay warm), and its exact lead over the driver
        is its hits minus the driver's, as if it had run beside the driver access by access."""
        keys, partial = self._full_keys, self._full_partial
        if not keys:
            return
        full, exact, driver = self._full, self._request_exact, self._driver
        driver_hits = self._full_driver_hits
        for j in range(len(full)):
            expert = full[j]
            if expert is not driver:
                exact[j] += access_all(expert, keys, partial) - driver_hits
        keys.clear()
        partial.clear()
        self._full_driver_hits = 0

    def _grow(self, capacity: int) -> None:
        self._run_full()  # the buffered accesses came before the growth
        self._capacity = capacity
        self._driver.resize(capacity)
        for expert in self._full:
            expert.resize(capacity)
        for shadow in self._shadows:
            if shadow is not None:
                shadow.resize(self._shadow_capacity())

    def on_access(self, key: Hashable, info: AccessInfo) -> None:
        if key in self._resident:
            self._touch(key, info)

    def on_remove(self, key: Hashable) -> None:
        resident, orphans = self._resident, self._orphans
        resident.discard(key)
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
        self._run_full()
        keep = max(0.0, 1.0 - self._request_touches / max(MIN_WINDOW, WINDOW * self._capacity))
        keys, partial = self._request_keys, self._request_partial
        if keys:  # the leader's sampled hits are the driver's (full size or twin); other full ones' are not used
            driver_hits, self._request_driver_hits = self._request_driver_hits, 0
            hits = [access_all(shadow, keys, partial) if shadow is not None else driver_hits
                    for shadow in self._shadows]
        else:
            hits = self._no_hits
        keys.clear()
        partial.clear()
        lead, lead_sq = self._lead, self._lead_sq
        base = hits[self._leader]
        exact = self._request_exact
        for j in range(len(exact)):
            lead_j = exact[j] * EXACT_SCALE
            exact[j] = 0
            i = self._full_index[j]
            lead[i] = lead[i] * keep + lead_j
            lead_sq[i] = lead_sq[i] * keep + lead_j * lead_j
        is_full = self._is_full
        for i in range(len(hits)):
            if is_full[i]:
                continue
            d = hits[i] - base
            lead[i] = lead[i] * keep + d
            lead_sq[i] = lead_sq[i] * keep + d * d
        self._weight = self._weight * keep + self._request_touches
        self._touches += self._request_touches
        self._request_touches = 0
        if self._touches >= self._quiet_until:
            best = self._challenger()
            if best >= 0:
                self._switch(best)

    def _challenger(self) -> int:
        """The expert whose lead over the leader is significant (LEAD_Z, MIN_LEAD) and largest in
        sampled hits (a full-size expert's exact lead counts at the sampling rate); -1: none."""
        lead, lead_sq = self._lead, self._lead_sq
        best, best_score = -1, 0.0
        for i in range(len(lead)):
            if i != self._leader and lead[i] > MIN_LEAD and self._significant(lead[i], lead_sq[i], i):
                score = lead[i] * (self._rate if self._is_full[i] else 1.0)
                if score > best_score:
                    best, best_score = i, score
        return best

    def _significant(self, lead: float, lead_sq: float, index: int) -> bool:
        """Whether expert `index`'s lead passes LEAD_Z standard errors after the prior's shrinkage."""
        n = self._weight * (1.0 if self._is_full[index] else self._rate)  # (sampled) accesses behind the lead
        if n <= 0.0:
            return False
        tau = PRIOR_POINTS / 100.0
        tau2 = tau * tau  # products, not **: compiled, ** is a call on boxed floats
        s2 = lead_sq / (n * n)  # the lead per access: its variance ...
        rate = lead / n  # ... and its value
        return rate * rate * tau2 > LEAD_Z * LEAD_Z * s2 * (tau2 + s2)

    def _rest_shadow(self, index: int, start: bool) -> None:
        """Let the driver stand in for the shadow of expert `index` (the leader), where that shadow would
        only replay a sample of what the driver does: every key sampled (rate 1, at the start: the two run
        the same accesses until the first switch), or no other expert sampled (the leader's shadow is then
        no other shadow's base; it is rebuilt from the driver's sampled keys at a switch away)."""
        if self._is_full[index] or self._fixed_capacity is None:
            return
        if self._threshold >= SAMPLE_SCALE:
            rest = start
        else:
            rest = not any(not self._is_full[i] for i in range(len(self._names)) if i != index)
        if rest:
            self._shadows[index] = None
            self._twin = True

    def _switch(self, index: int) -> None:
        old, resident = self._driver, self._resident
        for expert in self._full:
            expert.drops = None
        if self._twin:  # the driver stood in for the leader's shadow: it becomes that shadow (rate 1), or gives it its sample
            old.drops = None
            self._shadows[self._leader] = old if self._threshold >= SAMPLE_SCALE else sample_of(
                self._names[self._leader], self._shadow_capacity(), self._rate, self._threshold, old, resident)
            self._twin = False
        if self._is_full[index]:  # a full-size expert holds its own content: the switch loses nothing
            driver: Expert = self._full[self._full_index.index(index)]
        else:
            lru = self._lru if any(expert is self._lru for expert in self._full) else None
            driver = seeded(self._names[index], self._capacity, old, resident, lru, self._shadows[index], self._rate)
        driver.drops = self._drops
        self._driver, self._leader = driver, index
        self._rest_shadow(index, False)
        self._orphans = OrderedDict((k, None) for k in resident if k not in driver)
        self._lead = [0.0] * len(self._names)
        self._lead_sq = [0.0] * len(self._names)
        self.switches += 1
        logger.debug("adaptive: following %s (switch %d)", self._names[index], self.switches)


register_eviction_policy(AdaptiveEvictionPolicy)  # a statement, not a decorator: mypyc compiles only undecorated classes natively
