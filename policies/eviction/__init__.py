"""Eviction policies: which resident chunks leave a full tier first."""

from policies.eviction import _native
from policies.eviction.base import AccessInfo, EvictionPolicy
from policies.eviction.registry import eviction_policy_names, make_eviction_policy, register_eviction_policy

_native.load()  # before any policy module: the mypyc build beside the sources runs only if it matches them (_native)


def policy_implementation() -> str:
    """How the hot policies run in this process: "mypyc" (compiled) or "python"."""
    return _native.IMPLEMENTATION


__all__ = ["AccessInfo", "EvictionPolicy", "eviction_policy_names", "make_eviction_policy", "policy_implementation",
           "register_eviction_policy"]
