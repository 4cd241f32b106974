"""First come, first served: admit in arrival order (ties by request id)."""

from __future__ import annotations

from collections.abc import Sequence

from connector.engine.scheduling.base import WaitingRequest
from connector.engine.scheduling.registry import register_scheduling_policy


@register_scheduling_policy
class FCFSSchedulingPolicy:
    """Arrival order; a long request at the head blocks the ones behind it (head-of-line)."""

    name = "fcfs"

    def order(self, waiting: Sequence[WaitingRequest], now: float) -> list[WaitingRequest]:
        return sorted(waiting, key=lambda r: (r.arrival_time, r.request_id))

    def on_admit(self, admitted: WaitingRequest, still_waiting: Sequence[WaitingRequest], now: float) -> None:
        pass

    def on_remove(self, request: WaitingRequest) -> None:
        pass
