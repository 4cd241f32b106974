"""`make_policy`: every tier policy is built one way (`capacity=`), and admission is decided in this one place
for the store and `kvstore replay` alike (the replay-only policies: tests/sim/test_replay_only_policies.py)."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.errors import UnknownPolicyError
from policies.admission import AdmissionPolicy
from policies.eviction import EvictionPolicy, eviction_policy_names
from policies.tier_policy import make_policy


@pytest.mark.parametrize("name", eviction_policy_names())
def test_every_registered_eviction_policy_builds_with_a_capacity(name: Any) -> None:
    policy = make_policy(name, capacity=8)
    assert isinstance(policy.eviction, EvictionPolicy)
    assert policy.admission is None or isinstance(policy.admission, AdmissionPolicy)


def test_a_plain_policy_admits_everything() -> None:
    assert make_policy("lru", capacity=8).admission is None


def test_a_named_admission_overrides() -> None:
    policy = make_policy("adaptive+second_hit", capacity=8)
    assert policy.eviction.name == "adaptive" and policy.admission is not None and policy.admission.name == "second_hit"


@pytest.mark.parametrize("name", ["nope", "lru+nope"])
def test_unknown_names_list_the_valid_ones(name: Any) -> None:
    with pytest.raises(UnknownPolicyError, match="valid"):
        make_policy(name, capacity=8)
