"""A switch's handover in `adaptive`: one expert built from another's state (adaptive.py decides when).

A new driver holds the cache's resident keys. A hazard expert built from a hazard driver takes the
driver's classes, ages and ghost as they are; any other expert is seeded in recency order. A hazard
driver also takes its own shadow's class rates, so it does not relearn them. A shadow of the leader,
built when the cache leaves it, holds the driver's sampled keys on the sample's clock.
"""

from __future__ import annotations

from collections.abc import Hashable

from policies.eviction._expert_base import hash_sample_bits, sample_bits
from policies.eviction._expert_hazard import HazardExpert
from policies.eviction._expert_hazard_age import AgeBlendHazardExpert
from policies.eviction._experts import EXPERTS, Expert
from policies.eviction._fifo import KeySet


def new_shadow(name: str, capacity: int, rate: float) -> Expert:
    """An empty shadow of expert `name` that sees `rate` of the keys, in `capacity` (the cache's x rate).
    A hazard-a shadow's twins run on the keys a full-size hazard-a's twins would: its judgement of the
    age exponent is the driver's."""
    shadow = EXPERTS[name](capacity)
    if isinstance(shadow, AgeBlendHazardExpert):
        shadow.sample_keys(rate)
    return shadow


def recency(resident: KeySet, old: Expert, lru: Expert | None) -> list[Hashable]:
    """The resident keys, least recently used first: in `lru`'s order where a full-size LRU runs; else a
    hazard driver's stamps (each held key's last access), else the driver's own order. Resident keys the
    order does not cover come first."""
    if lru is not None:
        order: list[Hashable] = list(lru.order())
    elif isinstance(old, HazardExpert):
        order = old.by_touch()
    else:
        order = list(old.order())
    held = set(order)
    return [k for k in resident if k not in held] + [k for k in order if k in resident]


def seeded(name: str, capacity: int, old: Expert, resident: KeySet, lru: Expert | None,
           shadow: Expert | None, rate: float) -> Expert:
    """A new driver for expert `name` holding the resident keys (see the module docstring); `shadow` is
    its shadow on the keys sampled at `rate`, if it has one."""
    driver = EXPERTS[name](capacity)
    if isinstance(driver, HazardExpert) and isinstance(old, HazardExpert):
        driver.take_classes(old, resident)
    else:
        driver.seed(recency(resident, old, lru), old.reused())
    if isinstance(driver, HazardExpert) and isinstance(shadow, HazardExpert):
        driver.take_rates(shadow, 1.0 / rate)
    return driver


def sample_of(name: str, capacity: int, rate: float, threshold: int, old: Expert,
              resident: KeySet) -> Expert:
    """A shadow of expert `name` built from the driver `old`: its resident keys sampled under `threshold`
    (classes, ages, sampled ghost and rates scaled to the sample for a hazard expert; recency order
    otherwise), in `capacity` (the cache's x rate)."""
    shadow = new_shadow(name, capacity, rate)
    if isinstance(shadow, HazardExpert) and isinstance(old, HazardExpert):
        shadow.take_classes(old, {k for k in resident if sample_bits(k) < threshold},
                            {h for h in old.ghost_hashes() if hash_sample_bits(h) < threshold}, rate)
        shadow.take_rates(old, rate)
    else:
        shadow.seed([k for k in old.order() if k in resident and sample_bits(k) < threshold], old.reused())
    return shadow
