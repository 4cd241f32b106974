"""Admission policies: always, second_hit (seen twice), ghost (a ghost list would have hit)."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.errors import UnknownPolicyError
from policies.admission import AdmissionPolicy, admission_policy_names, make_admission_policy
from tests.policies.conftest import INFO


def miss(policy: Any, key: Any) -> bool:
    policy.on_miss(key, INFO)
    first = policy.admit(key, INFO)
    assert policy.admit(key, INFO) == first  # admit has no side effects
    return first


def test_registry() -> None:
    assert {"always", "second_hit", "ghost"} <= set(admission_policy_names())
    with pytest.raises(UnknownPolicyError, match="valid: always, ghost, second_hit"):
        make_admission_policy("sometimes")


@pytest.mark.parametrize("name", ["always", "second_hit", "ghost"])
def test_every_admission_policy_meets_the_protocol(name: str) -> None:
    assert isinstance(make_admission_policy(name, capacity=4), AdmissionPolicy)


def test_always_admits() -> None:
    policy = make_admission_policy("always")
    assert all(miss(policy, k) for k in "abcabc")


def test_second_hit_admits_the_second_miss_only() -> None:
    policy = make_admission_policy("second_hit", capacity=2, history_factor=1.0)  # remembers 2 keys
    assert [miss(policy, k) for k in "aab"] == [False, True, False]
    assert [miss(policy, k) for k in "cda"] == [False, False, False]  # c, d pushed a out of memory


def test_ghost_admits_recent_misses_and_recently_evicted_keys() -> None:
    policy = make_admission_policy("ghost", capacity=2, ghost_factor=1.0)  # ghost of 2 keys
    assert miss(policy, "a") is False
    assert miss(policy, "a") is True  # the ghost saw it: a cache twice as big would have hit
    policy.on_evict("x")  # an evicted block that comes back is admitted at once
    assert miss(policy, "x") is True
    for key in "pq":
        miss(policy, key)
    assert miss(policy, "a") is False  # forgotten: the ghost is bounded
