"""Eviction policy name -> class registry; `make_eviction_policy` raises on unknown names."""

from __future__ import annotations

from typing import Any

from kvstore.errors import UnknownPolicyError
from kvstore.registry import NameRegistry
from policies.eviction.base import EvictionPolicy

_REGISTRY: NameRegistry[EvictionPolicy] = NameRegistry("eviction policy", [
    "policies.eviction.lru",
    "policies.eviction.lfu",
    "policies.eviction.arc",
    "policies.eviction.s3fifo",
    "policies.eviction.adaptive",
])
register_eviction_policy = _REGISTRY.register
eviction_policy_names = _REGISTRY.names

# Policies only `kvstore replay` runs (kvstore/sim/eviction), named here so that a tier configured with
# one is told why it cannot have it rather than that the name is unknown.
REPLAY_ONLY = {
    "min": "Belady's MIN, the bound: it needs the future accesses",
    "pace": "PACE, the research policy adaptive replaced as the default: docs/pace.md",
}


def replay_only_message(name: str) -> str:
    """Why a tier cannot have the replay-only policy `name`, and which policies it can have."""
    return (f"eviction = {name!r} is a replay-only policy ({REPLAY_ONLY[name]}): `kvstore replay` runs it, a tier "
            f"cannot; the tier policies are: {', '.join(eviction_policy_names())}")


def make_eviction_policy(name: str, **options: Any) -> EvictionPolicy:
    """A new policy instance by registry name (`adaptive`, `lru`, `lfu`, `arc`, `s3fifo`).

    Every policy takes `capacity=` (chunks the tier holds, or None). `policies.tier_policy.make_policy`
    builds a tier's eviction and admission policies together.

    Raises:
        UnknownPolicyError: `name` is replay-only (`min`, `pace`) or unknown; the message lists the tier policies.
    """
    if name in REPLAY_ONLY:
        raise UnknownPolicyError(replay_only_message(name))
    return _REGISTRY.make(name, **options)
