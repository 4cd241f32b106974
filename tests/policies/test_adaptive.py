"""`adaptive`: its experts match the registered policies, it follows the expert that wins, and it
is never far behind the best classic policy on the suite's generated families."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from typing import Any

import pytest

from kvstore.sim.generators import generate, rows_to_trace
from kvstore.sim.replay import replay
from policies.eviction import AccessInfo, make_eviction_policy
from policies.eviction._expert_hazard import HazardExpert, ResidentHazardExpert
from policies.eviction._experts import EXPERTS
from policies.eviction.adaptive import FULL_BELOW, FULL_UP_TO, LEAD_Z, AdaptiveEvictionPolicy
from tests.policies.conftest import INFO, drive, make_policy, random_stream


def _expert_hits(name: str, stream: list[int], capacity: int) -> int:
    expert = EXPERTS[name](capacity)
    return sum(expert.access(key) for key in stream)


@pytest.mark.parametrize("name", ["lru", "arc", "s3fifo"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_experts_hit_exactly_where_the_registered_policies_hit(name: str, seed: int) -> None:
    """The key-only experts are the same algorithms as the registered policies, so the adaptive
    policy's scores are those policies' scores, up to details that move a few hits: ARC's expert is
    the textbook one (the registered ARC trims its ghosts after the insert), S3-FIFO's evicts
    before inserting (the registered one plans victims after the insert)."""
    stream = random_stream(seed, length=3000, num_keys=120)
    hits, _, _ = drive(make_policy(name, 16), stream, 16)
    tolerance = 0 if name == "lru" else 0.01 * len(stream)
    assert abs(_expert_hits(name, stream, 16) - hits) <= tolerance


def test_a_dropped_key_is_the_next_victim_and_a_refused_partial_block_is_not_admitted() -> None:
    policy = make_eviction_policy("adaptive", capacity=2, experts=("2q", "lru"), first="2q")
    for key in ("a", "b"):
        policy.on_miss(key, INFO)  # type: ignore[attr-defined]
        assert policy.admit(key, INFO)  # type: ignore[attr-defined]
        policy.on_insert(key, INFO)
    policy.on_miss("c", INFO)  # type: ignore[attr-defined]
    assert policy.admit("c", INFO)  # type: ignore[attr-defined]
    policy.on_insert("c", INFO)
    assert policy.victims(1) == ["a"], "2Q's probation FIFO drops its oldest key"
    policy.on_remove("a")
    partial = AccessInfo(is_partial=True)
    policy.on_miss("tail", partial)  # type: ignore[attr-defined]
    assert not policy.admit("tail", partial), "2Q never keeps a prompt's partly filled last block"  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(EXPERTS))
def test_every_expert_refuses_a_partly_filled_last_block_it_does_not_hold(name: str) -> None:
    """A prompt's partly filled last block gets a fresh key per request: admitting it only pushes out a
    key that can come back. Every expert refuses it (at 1% of a generated family, where a request
    fills a tenth of the cache, the S3-FIFO expert gained 0.17 points over the agent seeds by it:
    docs/adaptive.md, "Why it is built this way"), and one it already holds is a hit like any other."""
    expert = EXPERTS[name](8)
    for key in range(6):
        expert.access(key)
    assert not expert.access("tail", True) and "tail" not in expert
    assert all(key in expert for key in range(6)), "a refused key evicts nothing"
    expert.access("whole")
    assert expert.access("whole", True), "a held key is a hit, partial or not"


def _recency_stream(capacity: int, length: int) -> list[Hashable]:
    """Every key comes back once, capacity/4 new keys later: LRU hits every return, while S3-FIFO's
    small queue (10%) has evicted the key by then and only its ghost remembers it."""
    gap = capacity // 4
    stream: list[Hashable] = []
    for i in range(length):
        stream.append(("new", i))
        if i >= gap:
            stream.append(("new", i - gap))
    return stream


def test_it_leaves_an_expert_that_loses_and_gets_its_hits_back() -> None:
    capacity = 200
    stream = _recency_stream(capacity, 6000)
    s3fifo_hits, _, _ = drive(make_policy("s3fifo", capacity), stream, capacity)
    lru_hits, _, _ = drive(make_policy("lru", capacity), stream, capacity)
    assert lru_hits > s3fifo_hits + 1000  # the premise: a workload where the first expert loses
    policy = make_eviction_policy("adaptive", capacity=capacity, first="s3fifo")
    hits, _, _ = drive(policy, stream, capacity, use_admission=True)
    assert policy.mode != "s3fifo" and policy.switches >= 1  # type: ignore[attr-defined]
    assert hits > s3fifo_hits + 0.8 * (lru_hits - s3fifo_hits)


def _hit_rates(family: str, pct: float, seed: int = 0) -> dict[str, float]:
    trace = rows_to_trace(family, generate(family, seed=seed))
    return {p: replay(trace, p, pct).block_hit_rate * 100 for p in ("lru", "arc", "s3fifo", "adaptive")}


def test_beats_lru_by_points_on_scan_bursts() -> None:
    """One-shot long prompts flood an LRU cache; the adaptive policy follows a scan-resistant expert."""
    rates = _hit_rates("scan", 5.0)
    assert rates["adaptive"] > rates["lru"] + 3.0


@pytest.mark.parametrize(("family", "pct"), [("chat", 10.0), ("chat", 1.0), ("mix", 1.0), ("mix", 5.0)])
def test_within_margin_of_the_best_classic_policy(family: str, pct: float) -> None:
    """Cells where the best classic policy differs (ARC at chat 10% and mix 1-5%, LRU-ARC-S3-FIFO
    within 0.3 points at chat 1%, where a shadow would hold 13 keys without MIN_SHADOW)."""
    rates = _hit_rates(family, pct)
    assert rates["adaptive"] >= max(rates["lru"], rates["arc"], rates["s3fifo"]) - 0.3


def test_following_lru_it_hits_exactly_where_lru_hits() -> None:
    """LRU runs at full size and is itself the driver while LRU leads (no copy, nothing reseeded):
    the cache then hits exactly where a plain LRU of the same size hits."""
    capacity = 8
    rng = random.Random(7)
    stream = [i // 4 - rng.randrange(12) for i in range(4000)]  # a drifting working set: recency wins
    experts = ("lru", "arc", "s3fifo")  # LRU 2280 hits, ARC 2235, S3-FIFO 1765 (the hazard experts beat LRU here)
    assert all(_expert_hits(name, stream, capacity) < _expert_hits("lru", stream, capacity) for name in experts[1:])
    policy = make_eviction_policy("adaptive", capacity=capacity, experts=experts, first="lru")
    hits, _, _ = drive(policy, stream, capacity)
    assert policy.mode == "lru" and policy.switches == 0  # type: ignore[attr-defined]
    assert hits == _expert_hits("lru", stream, capacity) > 0



def test_inferred_capacity_without_a_size_still_keeps_the_contract() -> None:
    policy = make_eviction_policy("adaptive")
    stream = random_stream(5, length=500, num_keys=60)
    _, evicted, resident = drive(policy, stream, 10)
    assert evicted and len(policy) == len(resident) <= 10
    assert not set(policy.victims(20)) - resident


@pytest.mark.parametrize(("family", "seed", "pct", "leader"), [
    ("hotscan", 0, 1.0, "arc"),  # frequency-skewed reuse with scans: ARC leads at small capacities
    ("hotscan", 1, 10.0, "s3fifo"),  # an unseen seed, where S3-FIFO pulls ahead late in the trace
    ("onehit", 2, 5.0, "s3fifo"),  # one-hit-heavy stream, an unseen seed
    ("scan", 1, 1.0, "s3fifo"),  # an unseen seed of the suite's scan family (short of 0.3 before S3-FIFO ran full size)
    ("mix", 2, 1.0, "arc"),  # -0.63 when the hazard experts ran as sampled shadows at small capacities
    ("mix", 3, 1.0, "arc"),  # an unseen seed: -0.71 with sampled hazard shadows (a 64-key hazard-r shadow never showed its lead)
    # agent at 1% (about 40 blocks, requests of half the cache): -0.46 / -0.38 / -0.36 before the prior
    ("agent", 3, 1.0, "arc"),
    ("agent", 6, 1.0, "s3fifo"),
    ("agent", 8, 1.0, "lru"),
])
def test_within_margin_where_each_classic_leads(family: str, seed: int, pct: float, leader: str) -> None:
    """The families are built so that each classic leads in turn (the premise is checked too)."""
    rates = _hit_rates(family, pct, seed)
    best = max(rates[p] for p in ("lru", "arc", "s3fifo"))
    assert rates[leader] == best, f"premise: {leader} leads the classics on {family}:{seed} at {pct}%"
    assert rates["adaptive"] >= best - 0.3


def test_a_lead_as_significant_but_noisier_per_access_does_not_switch() -> None:
    """Regression (issue 28, agent at 1%): the test runs after every request, so the first lead to
    pass 2 standard errors is a peak; the prior shrinks a lead by its error per access. Two leads of
    2.5 standard errors over the same 10,000 accesses: one of 100 hits (0.4 points of error per
    access) still passes, one of 500 hits (2 points of error) does not."""
    policy = AdaptiveEvictionPolicy(100, experts=("lru", "s3fifo"), first="lru")
    policy._weight = 10_000.0
    s3fifo = policy._names.index("s3fifo")
    precise, noisy = (100.0, 40.0 ** 2), (500.0, 200.0 ** 2)
    assert all(lead ** 2 > LEAD_Z ** 2 * lead_sq for lead, lead_sq in (precise, noisy))  # the premise
    assert policy._significant(*precise, s3fifo)
    assert not policy._significant(*noisy, s3fifo)


def _hot_and_once(seed: int, length: int) -> list[Hashable]:
    """A popular set beside a flood of one-hit keys (S3-FIFO and hazard-r beat LRU here)."""
    rng = random.Random(seed)
    hot = [("hot", i) for i in range(300)]
    return [rng.choice(hot) if rng.random() < 0.4 else ("once", i) for i in range(length)]


def _beside(policy: Any, expert: Any, stream: Sequence[Hashable], capacity: int) -> tuple[list[bool], set[Hashable]]:
    """Drive `policy` and a plain `expert` over `stream`: per access, whether both hit or both missed;
    and the policy's resident set at the end."""
    resident: set[Hashable] = set()
    same_hits = []
    for key in stream:
        expert_hit = expert.access(key)
        same_hits.append((key in resident) == expert_hit)
        drive(policy, [key], capacity, use_admission=True, resident=resident)
    return same_hits, resident


def test_a_switch_to_s3fifo_hands_over_the_full_size_one() -> None:
    """S3-FIFO runs at full size beside the driver, so following it keeps its ghost and frequencies:
    once the keys the old driver left behind are gone, the cache holds and hits exactly what a plain
    S3-FIFO run from the start holds and hits (a freshly seeded one would not)."""
    capacity = 200
    policy = make_eviction_policy("adaptive", capacity=capacity, experts=("lru", "s3fifo"), first="lru")
    s3fifo = EXPERTS["s3fifo"](capacity)
    same_hits, resident = _beside(policy, s3fifo, _hot_and_once(3, 20000), capacity)
    assert policy.mode == "s3fifo" and policy.switches == 1  # type: ignore[attr-defined]
    assert all(same_hits[-5000:])
    assert resident == {key for key in s3fifo.order()}


def test_below_full_below_a_switch_to_a_hazard_expert_hands_over_the_full_size_one() -> None:
    """Under FULL_BELOW blocks every expert runs at full size (a shadow of a few dozen keys misjudges
    the hazard experts), so a switch to hazard-r loses nothing: once the old driver's keys are gone,
    the cache holds exactly what a plain hazard-r run from the start holds."""
    capacity = 200
    assert capacity < FULL_BELOW
    policy = AdaptiveEvictionPolicy(capacity, experts=("lru", "hazard-r"), first="lru")
    hazard = EXPERTS["hazard-r"](capacity)
    same_hits, resident = _beside(policy, hazard, _hot_and_once(3, 20000), capacity)
    assert policy.mode == "hazard-r" and policy.switches == 1
    assert all(same_hits[-5000:])
    assert resident == set(hazard.order())


def test_a_switch_between_hazard_variants_keeps_the_classes() -> None:
    """Above FULL_BELOW the hazard experts run on a sample; a switch from one to the other hands the
    driver's classes (and ages) to the new driver instead of reseeding every key as new, and the new
    driver starts from its own shadow's class rates."""
    capacity = 2 * FULL_BELOW
    policy = AdaptiveEvictionPolicy(capacity, experts=("lru", "hazard", "hazard-r"), first="hazard")
    drive(policy, _hot_and_once(4, 8 * capacity), capacity)
    old = policy._driver
    assert isinstance(old, HazardExpert) and policy.mode == "hazard"
    classes = {key: old.class_of(key) for key in old.order()}
    policy._switch(policy._names.index("hazard-r"))
    new = policy._driver
    assert isinstance(new, ResidentHazardExpert) and new is not old
    assert {key: new.class_of(key) for key in new.order()} == classes
    assert len(set(classes.values())) >= 2  # the premise: more than one class to keep
    shadow = policy._shadows[policy._names.index("hazard-r")]
    assert isinstance(shadow, HazardExpert)
    assert [c.hits for c in new.classes] == pytest.approx([c.hits / policy._rate for c in shadow.classes])


def test_above_full_up_to_every_expert_is_sampled_and_a_switch_seeds_in_recency_order() -> None:
    """Over FULL_UP_TO blocks no expert runs at full size (each would cost a key table per access for
    evidence the sample already gives); a switch away from a hazard driver then seeds the new driver in
    recency order from the driver's own stamps (each held key's last access), as the full-size LRU would."""
    capacity = FULL_UP_TO + 808
    policy = AdaptiveEvictionPolicy(capacity)
    assert policy._full == [] and all(shadow is not None or i == policy._leader
                                      for i, shadow in enumerate(policy._shadows))
    rng = random.Random(5)
    stream = [rng.randrange(3 * capacity) for _ in range(5 * capacity)]
    last_touch: dict[Hashable, int] = {}
    resident: set[Hashable] = set()
    for t, key in enumerate(stream):
        drive(policy, [key], capacity, resident=resident)
        last_touch[key] = t
    assert policy.mode == "hazard-a" and len(resident) == capacity
    policy._switch(policy._names.index("lru"))
    assert policy.mode == "lru"
    assert list(policy._driver.order()) == sorted(resident, key=last_touch.__getitem__)
