"""The replay-only eviction policies (kvstore/sim/eviction): a replay builds them, a tier is refused them
with the tier policies named; MIN against brute force; PACE's orders."""

from __future__ import annotations

import functools
import random

import pytest

from kvstore.config import TierConfig
from kvstore.errors import ConfigError, UnknownPolicyError
from kvstore.sim.eviction import make_replay_policy, replay_only_names, replay_policy_names
from kvstore.store.config_checks import check_names
from kvstore.types import TierKind
from policies.eviction import AccessInfo, eviction_policy_names
from policies.eviction.registry import REPLAY_ONLY
from policies.tier_policy import make_policy
from tests.policies.conftest import INFO, drive
from tests.policies.test_eviction_orders import chain_infos

TIER_POLICIES = "adaptive, arc, lfu, lru, s3fifo"


def test_the_names_a_tier_is_refused_are_the_replay_only_policies() -> None:
    assert sorted(REPLAY_ONLY) == replay_only_names() == ["min", "pace"]
    assert not set(replay_only_names()) & set(eviction_policy_names())
    assert replay_policy_names() == sorted([*eviction_policy_names(), *replay_only_names()])


@pytest.mark.parametrize("name", ["pace", "min", "pace+ghost"])
def test_a_tier_built_with_a_replay_only_policy_is_told_so_and_which_policies_it_can_have(name: str) -> None:
    with pytest.raises(UnknownPolicyError, match=f"replay-only.*kvstore replay.*tier policies are: {TIER_POLICIES}$"):
        make_policy(name, capacity=8)


@pytest.mark.parametrize("name", ["pace", "min"])
def test_a_config_naming_a_replay_only_policy_is_refused_before_the_store_opens(name: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_names(TierConfig(kind=TierKind.NVME, capacity_bytes=1 << 30, path="/nonexistent", eviction=name))
    message = str(refused.value)
    assert message.startswith(f"tier nvme: eviction = {name!r} is a replay-only policy")
    assert TIER_POLICIES in message and "set eviction to one of them" in message


def test_an_unknown_replay_policy_lists_every_one_a_replay_runs() -> None:
    with pytest.raises(UnknownPolicyError, match="valid: adaptive, arc, lfu, lru, min, pace, s3fifo"):
        make_replay_policy("belady", capacity=8)


def test_pace_is_its_own_admission_unless_one_is_named() -> None:
    policy = make_replay_policy("pace", capacity=8)
    assert policy.admission is policy.eviction and policy.admission_is_eviction
    named = make_replay_policy("pace+second_hit", capacity=8)
    assert named.eviction.name == "pace" and named.admission is not None and named.admission.name == "second_hit"


def test_min_gets_the_future() -> None:
    policy = make_replay_policy("min", capacity=1, future=["a", "b", "a"])
    policy.eviction.on_insert("a", INFO)
    policy.eviction.on_insert("b", INFO)
    assert policy.eviction.victims(1) == ["b"]  # b is never used again; a is


@functools.cache
def _best(stream: tuple[int, ...], capacity: int, index: int, resident: frozenset[int]) -> int:
    """Most hits achievable from `index` on, trying every bypass/eviction choice."""
    if index == len(stream):
        return 0
    key = stream[index]
    if key in resident:
        return 1 + _best(stream, capacity, index + 1, resident)
    options = [_best(stream, capacity, index + 1, resident)]  # bypass
    if len(resident) < capacity:
        options.append(_best(stream, capacity, index + 1, resident | {key}))
    else:
        options += [_best(stream, capacity, index + 1, (resident - {v}) | {key}) for v in resident]
    return max(options)


@pytest.mark.parametrize("seed", range(30))
def test_min_is_optimal_on_small_random_streams(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.randint(1, 3)
    stream = [rng.randrange(5) for _ in range(rng.randint(6, 14))]
    policy = make_replay_policy("min", capacity=capacity, future=stream).eviction
    hits, _, _ = drive(policy, stream, capacity)
    assert hits == _best(tuple(stream), capacity, 0, frozenset())


def test_min_prepare_replaces_the_future_and_bypasses_useless_inserts() -> None:
    policy = make_replay_policy("min", capacity=2).eviction
    policy.prepare(["a", "b", "c", "a", "b"])  # type: ignore[attr-defined]
    hits, evicted, _ = drive(policy, ["a", "b", "c", "a", "b"], 2)
    assert hits == 2 and evicted == ["c"]  # c is never used again: it is the one dropped


def test_pace_evicts_tail_first_and_learns_to_skip_partial_blocks() -> None:
    pace = make_replay_policy("pace", capacity=3).eviction
    for i in (2, 1, 0):
        info = chain_infos(3, "r0")[i]
        pace.on_miss(f"r0/{i}", info)  # type: ignore[attr-defined]
        pace.on_insert(f"r0/{i}", info)
    assert pace.victims(3) == ["r0/2", "r0/1", "r0/0"]


def _full_and_partial_stream(turns: int) -> list[tuple[str, AccessInfo]]:
    """Per turn: one of 4 full blocks (they come back every 4 turns) and a new partial last block."""
    stream = []
    for turn in range(turns):
        stream.append((f"full{turn % 4}", AccessInfo(position=0, chain_chunks=2)))
        stream.append((f"part{turn}", AccessInfo(position=1, chain_chunks=2, is_partial=True)))
    return stream


@pytest.mark.parametrize("name", ["lru", "pace"])
def test_pace_learns_that_partial_blocks_never_return(name: str) -> None:
    """6 slots, reuse distance 8 distinct blocks: LRU misses every full block; PACE learns the
    partial class never comes back, stops letting it push full blocks out, and hits them."""
    policy = make_replay_policy(name, capacity=6).eviction
    resident: set[str] = set()
    late_full_hits = 0
    for step, (key, info) in enumerate(_full_and_partial_stream(300)):
        if key in resident:
            late_full_hits += step >= 400
            policy.on_access(key, info)
            continue
        if name == "pace":
            policy.on_miss(key, info)  # type: ignore[attr-defined]
            if not policy.admit(key, info):  # type: ignore[attr-defined]
                continue
        policy.on_insert(key, info)
        resident.add(key)
        while len(resident) > 6:
            victim = policy.victims(1)[0]
            resident.discard(victim)
            policy.on_remove(victim)
    assert late_full_hits == (0 if name == "lru" else 100)
