"""Small drivers for policy tests: feed an access stream through a policy as a cache of N blocks."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from typing import Any

from kvstore.sim.eviction import make_replay_policy
from policies.eviction import AccessInfo

INFO = AccessInfo()


def make_policy(name: str, capacity: int, future: Sequence[Hashable] = ()) -> Any:
    """A policy for a `capacity`-block cache: a tier policy built as the store builds one, a replay-only one
    (`pace`, `min`) as `kvstore replay` does; `min` gets `future`."""
    return make_replay_policy(name, capacity=capacity, future=future).eviction


def drive(policy: Any, stream: Sequence[Hashable], capacity: int, pinned: frozenset = frozenset(),
          use_admission: bool = False, resident: set[Hashable] | None = None) -> tuple[int, list[Hashable], set[Hashable]]:
    """Run `stream` (insert-then-evict) on a cache holding `resident` (empty by default; updated in
    place); returns (hits, evictions in order, resident at the end)."""
    resident = set() if resident is None else resident
    evicted: list[Hashable] = []
    hits = 0
    admit = use_admission and callable(getattr(policy, "admit", None))
    for key in stream:
        if key in resident:
            hits += 1
            policy.on_access(key, INFO)
            continue
        if admit:
            policy.on_miss(key, INFO)
            if not policy.admit(key, INFO):
                continue
        policy.on_insert(key, INFO)
        resident.add(key)
        if len(resident) > capacity:
            for victim in policy.victims(len(resident) - capacity, pinned):
                assert victim in resident, f"{policy.name} proposed non-resident {victim!r}"
                resident.discard(victim)
                evicted.append(victim)
                policy.on_remove(victim)
    return hits, evicted, resident


def random_stream(seed: int, length: int = 400, num_keys: int = 40) -> list[int]:
    rng = random.Random(seed)
    # skewed: a few hot keys and a long tail, like prefix blocks
    return [min(int(rng.paretovariate(1.0)) - 1, num_keys - 1) if rng.random() < 0.6 else rng.randrange(num_keys)
            for _ in range(length)]
