"""The `SchedulingPolicy` protocol: which waiting request the engine admits next (decides only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class WaitingRequest(Protocol):
    """What a policy may read of a waiting request (the engine's Sequence satisfies it)."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int


@runtime_checkable
class SchedulingPolicy(Protocol):
    """Orders the waiting queue; the scheduler admits in that order while pages and budget allow.

    The scheduler calls `order` once per iteration, then `on_admit` for each request it admits,
    with the requests still waiting at that moment (so policies can count who was passed), and
    `on_remove` when a request leaves the waiting queue for good (finished or aborted).
    """

    name: str

    def order(self, waiting: Sequence[WaitingRequest], now: float) -> list[WaitingRequest]: ...

    def on_admit(self, admitted: WaitingRequest, still_waiting: Sequence[WaitingRequest], now: float) -> None: ...

    def on_remove(self, request: WaitingRequest) -> None: ...
