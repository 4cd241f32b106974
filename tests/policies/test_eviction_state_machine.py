"""Hypothesis state machine: every eviction policy (the replay-only ones too) against a set model under random calls and pins."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvstore.sim.eviction import replay_policy_names
from policies.eviction import AccessInfo
from tests.policies.conftest import make_policy

KEYS = st.integers(0, 11)


def machine_for(name: str) -> type[RuleBasedStateMachine]:
    class PolicyMachine(RuleBasedStateMachine):
        """Model: the set of resident keys. The policy must agree on size and only ever propose
        resident, unpinned, distinct keys, as many as exist (up to n)."""

        def __init__(self) -> None:
            super().__init__()
            self.policy = make_policy(name, 6)
            self.resident: set[int] = set()

        @rule(key=KEYS, position=st.integers(0, 3), partial=st.booleans())
        def touch(self, key: int, position: int, partial: bool) -> None:
            info = AccessInfo(position=position, chain_chunks=4, is_partial=partial)
            if key in self.resident:
                self.policy.on_access(key, info)
            else:
                self.policy.on_insert(key, info)
                self.resident.add(key)

        @rule(key=KEYS)
        def remove(self, key: int) -> None:
            self.policy.on_remove(key)
            self.resident.discard(key)

        @rule(n=st.integers(1, 8), pinned=st.frozensets(KEYS, max_size=4), evict=st.booleans())
        def victims(self, n: int, pinned: frozenset[int], evict: bool) -> None:
            proposed = self.policy.victims(n, pinned)
            assert self.policy.victims(n, pinned) == proposed
            assert len(set(proposed)) == len(proposed)
            assert set(proposed) <= self.resident - pinned
            assert len(proposed) == min(n, len(self.resident - pinned))
            if evict:
                for key in proposed:
                    self.policy.on_remove(key)
                    self.resident.discard(key)

        @invariant()
        def sizes_agree(self) -> None:
            assert len(self.policy) == len(self.resident)

    PolicyMachine.__name__ = f"{name}Machine"
    return PolicyMachine


@pytest.mark.parametrize("name", replay_policy_names())  # the tier policies and the replay-only ones; min without a future: every key "never again"
def test_policy_agrees_with_a_set_model(name: str) -> None:
    machine = machine_for(name)
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    machine.TestCase().runTest()
