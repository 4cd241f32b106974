"""Contract tests over every eviction policy, the tier ones and the replay-only ones (`kvstore replay` compares
them all under this one contract): capacity, pins, side-effect-free victims."""

from __future__ import annotations

import pytest

from kvstore.errors import UnknownPolicyError
from kvstore.sim.eviction import replay_policy_names
from policies.eviction import EvictionPolicy, eviction_policy_names, make_eviction_policy
from tests.policies.conftest import INFO, drive, make_policy, random_stream

NAMES = replay_policy_names()


def test_a_tier_may_pick_the_default_and_the_four_classics_and_a_replay_every_one() -> None:
    assert eviction_policy_names() == ["adaptive", "arc", "lfu", "lru", "s3fifo"]
    assert NAMES == ["adaptive", "arc", "lfu", "lru", "min", "pace", "s3fifo"]


def test_unknown_name_lists_valid_ones() -> None:
    with pytest.raises(UnknownPolicyError, match="valid: .*arc.*lru"):
        make_eviction_policy("nope")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_capacity_is_respected_and_len_tracks_residents(name: str, seed: int) -> None:
    stream = random_stream(seed)
    policy = make_policy(name, 8, future=stream)
    assert isinstance(policy, EvictionPolicy)
    _, evicted, resident = drive(policy, stream, 8)
    assert len(resident) <= 8
    assert len(policy) == len(resident)
    assert evicted, "a 40-key stream through 8 slots must evict"


@pytest.mark.parametrize("name", NAMES)
def test_pinned_keys_are_never_victims(name: str) -> None:
    stream = random_stream(7)
    pinned = frozenset(stream[:3])
    policy = make_policy(name, 8, future=stream)
    _, evicted, _ = drive(policy, stream, 8, pinned=pinned)
    assert not pinned & set(evicted)


@pytest.mark.parametrize("name", NAMES)
def test_victims_has_no_side_effects(name: str) -> None:
    """Asking for victims (repeatedly, any n) changes nothing: a twin fed the same calls without
    the extra questions evicts exactly the same keys."""
    stream = random_stream(3)
    quiet, nosy = make_policy(name, 6, future=stream), make_policy(name, 6, future=stream)
    resident: set = set()
    for key in stream:
        if resident:
            first = nosy.victims(3)
            assert nosy.victims(3) == first
            nosy.victims(len(resident))
        for policy in (quiet, nosy):
            (policy.on_access if key in resident else policy.on_insert)(key, INFO)
        resident.add(key)
        if len(resident) > 6:
            want = quiet.victims(1)
            assert nosy.victims(1) == want
            resident.discard(want[0])
            quiet.on_remove(want[0])
            nosy.on_remove(want[0])


@pytest.mark.parametrize("name", NAMES)
def test_remove_of_an_absent_key_and_victims_of_an_empty_policy_are_harmless(name: str) -> None:
    policy = make_policy(name, 4)
    policy.on_remove("never-inserted")
    assert policy.victims(2) == []
    policy.on_access("never-inserted", INFO)
    assert len(policy) == 0


@pytest.mark.parametrize("name", NAMES)
def test_deleting_a_resident_key_forgets_it(name: str) -> None:
    policy = make_policy(name, 4, future=["a", "b", "c"])
    for key in "abc":
        policy.on_insert(key, INFO)
    policy.on_remove("b")
    assert len(policy) == 2
    assert "b" not in policy.victims(3)
    assert set(policy.victims(3)) == {"a", "c"}


@pytest.mark.parametrize("name", NAMES)
def test_reinserting_a_resident_key_keeps_one_copy(name: str) -> None:
    """A re-put of a chunk already held is a touch: no duplicate in the order, no double count."""
    policy = make_policy(name, 4, future=["a", "b", "a", "c"])
    policy.on_insert("a", INFO)
    policy.on_access("a", INFO)  # ARC: a moves to T2; S3-FIFO: freq 1
    policy.on_insert("b", INFO)
    policy.on_insert("a", INFO)
    policy.on_insert("c", INFO)
    assert len(policy) == 3
    victims = policy.victims(5)
    assert sorted(victims) == ["a", "b", "c"]
