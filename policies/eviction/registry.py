"""Eviction policy name -> class registry; `make_eviction_policy` raises on unknown names."""

from __future__ import annotations

import importlib
from typing import Any, TypeVar

from kvstore.errors import UnknownPolicyError

T = TypeVar("T", bound=type)
_REGISTRY: dict[str, type] = {}
# Modules that register policies when imported; policies added later list themselves here.
_MODULES = [
    "policies.eviction.lru",
    "policies.eviction.lfu",
    "policies.eviction.arc",
    "policies.eviction.s3fifo",
    "policies.eviction.belady",
    "policies.eviction.pace",
]


def register_eviction_policy(cls: T) -> T:
    _REGISTRY[cls.name] = cls  # type: ignore[attr-defined]
    return cls


def _load_all() -> None:
    for module in _MODULES:
        importlib.import_module(module)


def eviction_policy_names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def policy_class(name: str) -> type:
    """The class registered as `name`; raises UnknownPolicyError listing the valid names."""
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown eviction policy {name!r}; valid: {', '.join(sorted(_REGISTRY))}"
        ) from None


def make_eviction_policy(name: str, **options: Any) -> Any:
    """A new policy instance by registry name (`lru`, `lfu`, `arc`, `s3fifo`, `min`, `pace`).

    Options are the class's constructor arguments, e.g. `capacity=` (chunks the tier holds) for
    the policies that size ghost lists by it, and `future=` (the access sequence) for `min`.
    """
    return policy_class(name)(**options)
