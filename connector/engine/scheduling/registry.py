"""Scheduling policy name -> class registry; `make_scheduling_policy` raises on unknown names."""

from __future__ import annotations

from typing import Any

from kvstore.registry import NameRegistry

_REGISTRY = NameRegistry("scheduling policy", ["connector.engine.scheduling.fcfs",
                                               "connector.engine.scheduling.shortest_prompt",
                                               "connector.engine.scheduling.quota_aging"])
register_scheduling_policy = _REGISTRY.register
scheduling_policy_names = _REGISTRY.names


def make_scheduling_policy(name: str, **options: Any) -> Any:
    """A new policy by registry name (`fcfs`, `spf`, `quota`); options go to its constructor."""
    return _REGISTRY.make(name, **options)
