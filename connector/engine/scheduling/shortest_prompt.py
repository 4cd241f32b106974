"""Shortest prompt first with aging: priority = prompt tokens - aging_tokens_per_s * seconds waited."""

from __future__ import annotations

from collections.abc import Sequence

from connector.engine.scheduling.base import WaitingRequest
from connector.engine.scheduling.registry import register_scheduling_policy
from kvstore.errors import ConfigError


@register_scheduling_policy
class ShortestPromptSchedulingPolicy:
    """Short prompts go first (lower mean TTFT); waiting earns credit so a long prompt is not starved.

    A request of P tokens that has waited w seconds ranks as P - aging_tokens_per_s * w, so it
    overtakes any newly arrived request once w > P / aging_tokens_per_s. With aging 0 this is
    plain SPF, which can starve long prompts forever.
    """

    name = "spf"

    def __init__(self, aging_tokens_per_s: float = 1000.0) -> None:
        if aging_tokens_per_s < 0:
            raise ConfigError(f"aging_tokens_per_s must be >= 0, got {aging_tokens_per_s}")
        self.aging_tokens_per_s = aging_tokens_per_s

    def order(self, waiting: Sequence[WaitingRequest], now: float) -> list[WaitingRequest]:
        def rank(r: WaitingRequest) -> tuple[float, float, str]:
            waited_s = max(0.0, now - r.arrival_time)
            return (r.num_prompt_tokens - self.aging_tokens_per_s * waited_s, r.arrival_time, r.request_id)

        return sorted(waiting, key=rank)

    def on_admit(self, admitted: WaitingRequest, still_waiting: Sequence[WaitingRequest], now: float) -> None:
        pass

    def on_remove(self, request: WaitingRequest) -> None:
        pass
