"""The policies a replay can build: every tier policy (`policies.eviction`) and the replay-only ones here.

A replay-only policy is one a daemon has no use for: `min` needs the future accesses, `pace` is the
research policy `adaptive` replaced as the default (docs/pace.md). Their names are also listed in
`policies.eviction.registry.REPLAY_ONLY`, so that a tier configured with one is told why it cannot have
it; `tests/sim/test_replay_only_policies.py` keeps the two lists equal.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

from kvstore.errors import UnknownPolicyError
from kvstore.registry import NameRegistry
from policies.eviction import EvictionPolicy, eviction_policy_names, make_eviction_policy
from policies.tier_policy import TierPolicy, with_admission

_REGISTRY: NameRegistry[EvictionPolicy] = NameRegistry("replay-only eviction policy", [
    "kvstore.sim.eviction.pace",
    "kvstore.sim.eviction.belady",
])
register_replay_policy = _REGISTRY.register
replay_only_names = _REGISTRY.names
_OFFLINE: set[str] = set()
T = TypeVar("T", bound=type)


def register_offline_policy(cls: T) -> T:
    """Register a replay-only policy that needs the future access sequence (`future=`), e.g. Belady's MIN."""
    _OFFLINE.add(cls.name)  # type: ignore[attr-defined]
    return _REGISTRY.register(cls)


def replay_policy_names() -> list[str]:
    """Every eviction policy `kvstore replay` runs: the tier policies and the replay-only ones."""
    return sorted({*eviction_policy_names(), *replay_only_names()})


def is_offline(name: str) -> bool:
    """Whether the eviction policy `name` needs the future accesses; raises UnknownPolicyError, listing the valid names."""
    _check_known(name)
    return name in _OFFLINE


def make_replay_policy(name: str, *, capacity: int | None, future: Sequence[Hashable] = ()) -> TierPolicy:
    """The policies named `EVICTION[+ADMISSION]` (e.g. `lru`, `pace`, `min`, `lru+ghost`) for `capacity` blocks.

    A tier policy is built as the store builds it (`policies.tier_policy.make_policy`); an offline one (`min`)
    is also given `future`, the access sequence.

    Raises:
        UnknownPolicyError: an unknown eviction or admission name (the message lists the valid ones).
    """
    evict_name, _, admit_name = name.partition("+")
    eviction = _make_eviction(evict_name, capacity=capacity, future=future)
    return with_admission(eviction, admit_name, capacity=capacity)


def _check_known(name: str) -> None:
    if name not in replay_policy_names():
        raise UnknownPolicyError(f"unknown eviction policy {name!r}; valid: {', '.join(replay_policy_names())}")


def _make_eviction(name: str, *, capacity: int | None, future: Sequence[Hashable]) -> EvictionPolicy:
    _check_known(name)
    if name in _OFFLINE:
        return _REGISTRY.make(name, capacity=capacity, future=list(future))
    if name in replay_only_names():
        return _REGISTRY.make(name, capacity=capacity)
    return make_eviction_policy(name, capacity=capacity)
