"""Eviction policy name -> class registry; `make_eviction_policy` raises on unknown names."""

from __future__ import annotations

from typing import Any, TypeVar

from kvstore.registry import NameRegistry
from policies.eviction.base import EvictionPolicy

_REGISTRY: NameRegistry[EvictionPolicy] = NameRegistry("eviction policy", [
    "policies.eviction.lru",
    "policies.eviction.lfu",
    "policies.eviction.arc",
    "policies.eviction.s3fifo",
    "policies.eviction.belady",
    "policies.eviction.pace",
    "policies.eviction.adaptive",
])
register_eviction_policy = _REGISTRY.register
eviction_policy_names = _REGISTRY.names
policy_class = _REGISTRY.get  # the class registered as a name; raises UnknownPolicyError
_OFFLINE: set[str] = set()
T = TypeVar("T", bound=type)


def register_offline_eviction_policy(cls: T) -> T:
    """Register a policy that needs the future access sequence (`future=`), e.g. Belady's MIN."""
    _OFFLINE.add(cls.name)  # type: ignore[attr-defined]
    return _REGISTRY.register(cls)


def is_offline(name: str) -> bool:
    policy_class(name)  # raises UnknownPolicyError, listing the valid names
    return name in _OFFLINE


def make_eviction_policy(name: str, **options: Any) -> EvictionPolicy:
    """A new policy instance by registry name (`lru`, `lfu`, `arc`, `s3fifo`, `min`, `pace`, `adaptive`).

    Every policy takes `capacity=` (chunks the tier holds, or None); offline ones (`min`) also
    `future=` (the access sequence). `policies.tier_policy.make_policy` builds both for a tier.
    """
    return _REGISTRY.make(name, **options)
