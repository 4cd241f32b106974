"""`make_policy`: every registered policy is built one way (`capacity=`, and `future=` for offline
ones), and admission is decided in this one place for the store and `kvstore replay` alike."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.errors import UnknownPolicyError
from policies.admission import AdmissionPolicy
from policies.eviction import AccessInfo, EvictionPolicy, eviction_policy_names
from policies.tier_policy import make_policy


@pytest.mark.parametrize("name", eviction_policy_names())
def test_every_registered_eviction_policy_builds_with_a_capacity(name: Any) -> None:
    policy = make_policy(name, capacity=8, future=[b"a", b"b"])
    assert isinstance(policy.eviction, EvictionPolicy)
    assert policy.admission is None or isinstance(policy.admission, AdmissionPolicy)


def test_an_adaptive_policy_is_its_own_admission() -> None:
    policy = make_policy("pace", capacity=8)
    assert policy.admission is policy.eviction and policy.admission_is_eviction


def test_a_plain_policy_admits_everything() -> None:
    assert make_policy("lru", capacity=8).admission is None


def test_a_named_admission_overrides() -> None:
    policy = make_policy("pace+second_hit", capacity=8)
    assert policy.eviction.name == "pace" and policy.admission is not None and policy.admission.name == "second_hit"


def test_min_gets_the_future() -> None:
    policy = make_policy("min", capacity=1, future=["a", "b", "a"])
    info = AccessInfo()
    policy.eviction.on_insert("a", info)
    policy.eviction.on_insert("b", info)
    assert policy.eviction.victims(1) == ["b"]  # b is never used again; a is


@pytest.mark.parametrize("name", ["nope", "lru+nope"])
def test_unknown_names_list_the_valid_ones(name: Any) -> None:
    with pytest.raises(UnknownPolicyError, match="valid"):
        make_policy(name, capacity=8)
