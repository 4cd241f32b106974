"""Scheduling policy name -> class registry; `make_scheduling_policy` raises on unknown names."""

from __future__ import annotations

from typing import Any

from kvstore.registry import NameRegistry

# Any: the scheduler hands the policy its own Sequence objects and reads them back (a WaitingRequest
# Protocol is what a policy may read; typing the round trip is the engine's to do).
_REGISTRY: NameRegistry[Any] = NameRegistry("scheduling policy", ["connector.engine.scheduling.fcfs",
                                                                  "connector.engine.scheduling.shortest_prompt",
                                                                  "connector.engine.scheduling.quota_aging"])
register_scheduling_policy = _REGISTRY.register
scheduling_policy_names = _REGISTRY.names


def make_scheduling_policy(name: str, **options: Any) -> Any:
    """A new policy by registry name (`fcfs`, `spf`, `quota`); options go to its constructor."""
    return _REGISTRY.make(name, **options)
