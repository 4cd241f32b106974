"""Scheduling policy name -> class registry; `make_scheduling_policy` raises on unknown names."""

from __future__ import annotations

import importlib
from typing import Any, TypeVar

from kvstore.errors import UnknownPolicyError

T = TypeVar("T", bound=type)
_REGISTRY: dict[str, type] = {}
_MODULES = ["policies.scheduling.fcfs", "policies.scheduling.shortest_prompt", "policies.scheduling.quota_aging"]


def register_scheduling_policy(cls: T) -> T:
    _REGISTRY[cls.name] = cls  # type: ignore[attr-defined]
    return cls


def _load_all() -> None:
    for module in _MODULES:
        importlib.import_module(module)


def scheduling_policy_names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def make_scheduling_policy(name: str, **options: Any) -> Any:
    """A new policy by registry name (`fcfs`, `spf`, `quota`); options go to its constructor."""
    _load_all()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown scheduling policy {name!r}; valid: {', '.join(sorted(_REGISTRY))}"
        ) from None
    return cls(**options)
