"""Eviction policies: which resident chunks leave a full tier first."""

from policies.eviction import _native
from policies.eviction.base import AccessInfo, EvictionPolicy
from policies.eviction.registry import eviction_policy_names, make_eviction_policy, register_eviction_policy

_native.load()  # imports of the hot policies get a fresh mypyc build in place of the sources, if one exists (see _native)

__all__ = ["AccessInfo", "EvictionPolicy", "eviction_policy_names", "make_eviction_policy", "register_eviction_policy"]
