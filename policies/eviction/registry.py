"""Eviction policy name -> class registry; `make_eviction_policy` raises on unknown names."""

from __future__ import annotations

from typing import Any

from kvstore.registry import NameRegistry

_REGISTRY = NameRegistry("eviction policy", [
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


def make_eviction_policy(name: str, **options: Any) -> Any:
    """A new policy instance by registry name (`lru`, `lfu`, `arc`, `s3fifo`, `min`, `pace`, `adaptive`).

    Options are the class's constructor arguments, e.g. `capacity=` (chunks the tier holds) for
    the policies that size ghost lists by it, and `future=` (the access sequence) for `min`.
    """
    return _REGISTRY.make(name, **options)
