"""Hit rate against capacity comes from kvstore.sim.replay; the tier split follows the inclusive rule."""

from __future__ import annotations

from kvstore.plan.capacity import HitRateModel
from kvstore.sim.replay import replay

from .conftest import make_trace

# [A,B] [A,B] [C] [A,B], 16-token blocks: 7 blocks of tokens in all.
# LRU, 2 blocks: request 2 hits A,B; C evicts B (A was touched last); request 4 hits A only -> 3/7.
# LRU, 3 blocks (or more): request 4 hits A,B -> 4/7.  MIN, 2 blocks: C is never used again,
# so MIN bypasses it and request 4 hits A,B -> 4/7.
CHAINS = [(1, 2), (1, 2), (3,), (1, 2)]


def test_hit_rates_by_hand_and_equal_to_replay() -> None:
    trace = make_trace(CHAINS)
    model = HitRateModel(trace, "lru", block_bytes=1000)
    assert model.hit_rate(2) == 3 / 7 == replay(trace, "lru", 2 * 100 / 3).token_hit_rate
    assert model.hit_rate(3) == 4 / 7
    assert model.hit_rate(2, "min") == 4 / 7
    assert model.hit_rate(0) == 0.0
    assert model.hit_rate(50) == model.hit_rate(3)  # beyond the distinct blocks nothing changes


def test_curve_has_policy_and_min() -> None:
    model = HitRateModel(make_trace(CHAINS), "lru", block_bytes=1000)
    points = model.curve(pcts=(50.0, 100.0))
    assert [(p.capacity_blocks, p.capacity_bytes) for p in points] == [(2, 2000), (3, 3000)]
    assert [(p.hit_rate, p.min_hit_rate) for p in points] == [(3 / 7, 4 / 7), (4 / 7, 4 / 7)]


def test_fewest_blocks_for_a_target() -> None:
    model = HitRateModel(make_trace(CHAINS), "lru", block_bytes=1000)
    assert model.blocks_for_hit_rate(0.5) == 3
    assert model.blocks_for_hit_rate(0.4) == 2
    assert model.blocks_for_hit_rate(0.6) is None  # above what unlimited capacity gives


def test_tier_shares_are_inclusive() -> None:
    model = HitRateModel(make_trace(CHAINS), "lru", block_bytes=1000)
    h1, h2, h3 = model.hit_rate(1), model.hit_rate(2), model.hit_rate(3)
    assert model.tier_shares([1, 2, 3]) == [h1, h2 - h1, h3 - h2]
    assert model.tier_shares([3, 1]) == [h3, 0.0]  # a smaller tier below a bigger one adds nothing
