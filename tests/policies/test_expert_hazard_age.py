"""`hazard-a` (`AgeBlendHazardExpert`): the age exponent of the hazard score, learned from two twins;
the twins on a sample at large capacities; a copy of a hazard expert onto another clock; and the
leader's shadow that `adaptive` rests while no other expert needs it (docs/adaptive.md)."""

from __future__ import annotations

from typing import cast

import pytest

from kvstore.sim.replay import _run, capacity_blocks_for
from kvstore.sim.suite import load_replay_trace
from kvstore.sim.trace import Trace
from policies.eviction._expert_base import SAMPLE_SCALE, sample_bits
from policies.eviction._expert_hazard import CLASS_BITS, TWICE, HazardExpert
from policies.eviction._expert_hazard_age import BLEND_MIN_EVIDENCE, TWIN_KEYS, AgeBlendHazardExpert
from policies.eviction._experts import EXPERTS
from policies.eviction._handover import new_shadow
from policies.eviction.adaptive import FULL_UP_TO, AdaptiveEvictionPolicy
from policies.eviction.base import EvictionPolicy


def _replay(policy: AdaptiveEvictionPolicy, trace: Trace, capacity: int) -> int:
    """Block hits of `trace` replayed through `policy` (kvstore.sim.replay's loop)."""
    return _run(trace, cast(EvictionPolicy, policy), None, capacity, progress=False)[0]


def _old_reused_key_and_young_new_key(alpha: float) -> HazardExpert:
    """x touched twice long ago (age 40 at the eviction), y new and young (age 1): rates 1 and 0.25."""
    expert = HazardExpert(2)
    expert.alpha = alpha
    expert.access("tail-x", True)
    expert.access("x")
    expert.access("x")  # x: class TWICE
    for _ in range(38):
        expert.access("tail", True)  # time passes (a partly filled tail is never admitted)
    expert.access("tail-y", True)
    expert.access("y")  # y: class 0, the youngest
    for reuse_class in expert.classes:
        reuse_class.hits, reuse_class.entries = 1.0, 4.0
    expert.classes[TWICE].hits = 4.0
    expert.access("tail-z", True)
    expert.access("z")  # over capacity: one of x and y goes
    return expert


def test_the_age_exponent_decides_between_an_old_reused_key_and_a_young_new_one() -> None:
    """rate / age ** alpha: alpha 1 (log-uniform reuse distances) drops the old reused key
    (1 / 40 < 0.25 / 1), alpha 0 (independent references) the new key of the lower rate."""
    by_age = _old_reused_key_and_young_new_key(1.0)
    assert "x" not in by_age and "y" in by_age
    by_rate = _old_reused_key_and_young_new_key(0.0)
    assert "y" not in by_rate and "x" in by_rate


@pytest.mark.parametrize(("workload", "pct", "learns"), [
    ("gen:agent", 10.0, "age"),  # a long context re-read at growing distances: rate / age leads
    ("gen:rag", 1.0, "rate"),  # Zipf-popular documents, drawn independently: the rate alone leads
])
def test_hazard_a_learns_the_exponent_of_the_workload(workload: str, pct: float, learns: str) -> None:
    trace = load_replay_trace(workload)
    capacity = capacity_blocks_for(trace, pct)
    policy = AdaptiveEvictionPolicy(capacity, experts=("hazard-a",), first="hazard-a")
    hits = _replay(policy, trace, capacity)
    expert = policy._driver
    assert isinstance(expert, AgeBlendHazardExpert) and hits > 0
    if learns == "age":
        assert expert.alpha > 0.9 and expert.lead > 0
    else:
        assert expert.alpha < 0.1 and expert.lead < 0


def test_above_twin_keys_the_twins_run_on_a_hash_sample() -> None:
    capacity = 8 * TWIN_KEYS
    expert = AgeBlendHazardExpert(capacity)
    assert expert.twin_rate == pytest.approx(1 / 8, abs=1e-4)
    twin_capacity = round(capacity * expert.twin_rate)
    assert expert.log_uniform.capacity == expert.independent.capacity == twin_capacity
    for key in range(4 * capacity):
        expert.access(key)
    threshold = expert.twin_rate * SAMPLE_SCALE
    for twin in (expert.log_uniform, expert.independent):
        assert len(twin.where) == twin_capacity
        assert all(sample_bits(key) < threshold for key in twin.where)
    assert len(expert.where) == capacity  # the expert itself is whole
    small = AgeBlendHazardExpert(TWIN_KEYS - 1)
    assert small.twin_rate == 1.0 and small.log_uniform.capacity == TWIN_KEYS - 1


def test_a_copy_onto_a_slower_clock_keeps_classes_and_scales_ages() -> None:
    old = HazardExpert(8)
    for key in range(12):  # 4 into the ghost
        old.access(key)
    old.access(10)  # 10 touched twice
    keep = {10, *sorted(cast(dict[int, int], old.where))[:2]}
    remembered = set(sorted(cast(dict[int, int], old.ghost))[:2])
    assert len(keep) == 3 and len(remembered) == 2 and old.class_of(10) == TWICE
    new = HazardExpert(8)
    new.take_classes(old, keep, ghost_keys=remembered, time_scale=0.5)
    assert set(new.where) == keep and set(new.ghost) == remembered
    assert new.now == old.now // 2
    for key in keep:
        assert new.class_of(key) == old.class_of(key)
        assert new.where[key] >> CLASS_BITS == (old.where[key] >> CLASS_BITS) // 2
    for key in remembered:
        assert new.ghost_class_of(key) == old.ghost_class_of(key)


def test_adaptive_rests_the_leaders_shadow_and_rebuilds_it_from_the_driver_at_a_switch() -> None:
    """Above FULL_BELOW with the default experts hazard-a is the one sampled expert: while it leads its
    shadow would be no one's base, so the driver stands in; a switch away builds the shadow from the
    driver's sampled resident keys, in their classes, on the sample's clock."""
    trace = load_replay_trace("gen:chat")
    capacity = capacity_blocks_for(trace, 10.0)
    policy = AdaptiveEvictionPolicy(capacity)
    leader = policy._leader
    assert policy.mode == "hazard-a" and policy._shadows[leader] is None and policy._twin
    _replay(policy, trace.head(len(trace.requests) // 4), capacity)
    driver = policy._driver
    assert isinstance(driver, AgeBlendHazardExpert)
    now = driver.now
    threshold = policy._threshold
    sampled = {key for key in policy._resident if sample_bits(key) < threshold}
    assert sampled
    policy._switch(policy._names.index("lru"))
    shadow = policy._shadows[leader]
    assert isinstance(shadow, AgeBlendHazardExpert) and not policy._twin
    assert set(shadow.where) == sampled
    assert shadow.capacity == policy._shadow_capacity() < capacity
    assert all(shadow.class_of(key) == driver.class_of(key) for key in sampled)
    assert shadow.now == int(now * policy._rate)
    assert all(sample_bits(key) < threshold for key in shadow.ghost)
    for mine, theirs in ((shadow.log_uniform, driver.log_uniform), (shadow.independent, driver.independent)):
        # the twins are the driver's twins (the same keys), whether or not the cache still holds a key
        assert set(mine.where) == set(theirs.where) and set(mine.ghost) == set(theirs.ghost)
        assert all(mine.class_of(key) == theirs.class_of(key) for key in theirs.where)
    assert set(driver.log_uniform.where) - set(policy._resident)  # the premise: a twin holds keys the cache does not
    assert isinstance(EXPERTS["hazard-a"](4), AgeBlendHazardExpert)


def test_until_its_twins_disagree_hazard_a_evicts_as_the_plain_hazard_expert() -> None:
    """No evidence, no change: on a stream where the twins agree (one-shot keys in runs, then one key
    re-read) hazard-a drops what the plain hazard expert drops, alpha 1, not its newest keys."""
    plain, blend = HazardExpert(8), AgeBlendHazardExpert(8)
    plain.drops, blend.drops = [], []
    for expert in (plain, blend):
        for key in range(60):
            if key % 5 == 0:
                expert.access(f"tail-{key}", True)
            expert.access(key)
    assert blend.drops == plain.drops and len(plain.drops) == 52
    assert blend.alpha == 1.0 and blend.lead_sq < BLEND_MIN_EVIDENCE


def _direct_victim(expert: HazardExpert, now: int, alpha: float) -> int:
    """The class whose head has the lowest rate / age ** alpha, computed as the formula reads."""
    scores = [(c.hits / c.entries / float(now - c.head) ** alpha, cls)
              for cls, c in enumerate(expert.classes) if c.head >= 0]
    return min(scores)[1]


def test_the_cached_powers_rank_class_heads_as_the_formula_does() -> None:
    """Between 0 and 1, alpha ranks class heads by rate ** (1 / alpha) / age, each class's power kept
    until its rate or alpha changes: the victim is the formula's at every eviction of a real trace,
    and a power that would lose its precision hands the ranking back to the formula (-1)."""
    trace = load_replay_trace("gen:chat")
    expert = HazardExpert(capacity_blocks_for(trace, 5.0))
    checked = 0
    for i, request in enumerate(trace.requests):
        for position in range(len(request.block_ids) - 1, -1, -1):
            expert.access(request.block_ids[position])
        if len(expert.where) >= expert.capacity and sum(c.head >= 0 for c in expert.classes) >= 3:
            alpha = (0.15, 0.5, 0.85)[i % 3]
            now = expert.now + 1
            got = expert._blend_victim(now, alpha)
            assert got == _direct_victim(expert, now, alpha)
            assert expert._blend_victim(now + 7, alpha) == _direct_victim(expert, now + 7, alpha)  # cached powers, later ages
            checked += 1
    assert checked > 100
    tiny = HazardExpert(4)
    for key in "abcd":
        tiny.access(key)
    tiny.classes[0].hits = 1e-6  # ** (1 / 0.011): far under the smallest float
    assert tiny._blend_victim(tiny.now + 1, 0.011) == -1
    now = tiny.now + 1
    assert _direct_victim(tiny, now, 0.011) == 0
    tiny.alpha = 0.011
    tiny._evict(now)  # ranks by the formula instead: class 0's head goes
    assert "a" not in tiny.where and len(tiny.where) == 3


@pytest.mark.parametrize(("whole", "shadow_rate"), [(18279, 1 / 16), (4096, 1 / 8)])
def test_a_shadows_twins_run_on_the_keys_the_caches_own_twins_would(whole: int, shadow_rate: float) -> None:
    """A hazard-a shadow on a sample of the keys stands for the whole cache: its twins see the keys a
    full-size hazard-a's twins see (all of the shadow's, or a subset by the same hash), hold as many,
    and decay over the same window. Sized from the shadow's own capacity they would be a smaller,
    noisier pair, and on the conversation trace at 10% the cache left hazard-a for LRU and lost 1.3 points."""
    full = AgeBlendHazardExpert(whole)
    shadow = AgeBlendHazardExpert(round(whole * shadow_rate))
    shadow.sample_keys(shadow_rate)
    keys = [k for k in range(200_000) if sample_bits(k) < int(shadow_rate * SAMPLE_SCALE)]
    assert [shadow.sampled(k) for k in keys] == [full.sampled(k) for k in keys]
    assert abs(shadow.log_uniform.capacity - full.log_uniform.capacity) <= 1
    assert shadow._keep == pytest.approx(full._keep, rel=1e-3)
    policy = AdaptiveEvictionPolicy(whole)
    hazard_a = policy._names.index("hazard-a")
    built = new_shadow("hazard-a", policy._shadow_capacity(), policy._rate)
    assert isinstance(built, AgeBlendHazardExpert) and built.key_rate == policy._rate
    running = policy._shadows[hazard_a]  # None while hazard-a leads and no other expert is sampled
    assert running is None or (isinstance(running, AgeBlendHazardExpert) and running.key_rate == policy._rate)
    assert (running is None) == (whole <= FULL_UP_TO)
