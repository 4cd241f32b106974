"""Quota/debt-bounded aging: shortest first, but a waiting request is passed at most Q times or D tokens."""

from __future__ import annotations

from collections.abc import Sequence

from connector.engine.scheduling.base import WaitingRequest
from connector.engine.scheduling.registry import register_scheduling_policy
from kvstore.errors import ConfigError


@register_scheduling_policy
class QuotaAgingSchedulingPolicy:
    """SPF with a hard bound on unfairness.

    Each admission of a request that arrived *after* a still-waiting one counts as passing it:
    the waiting request's pass count goes up by one and its debt by the admitted prompt's tokens.
    Once a request has been passed `max_passes` times or owes `max_debt_tokens`, it is due: due
    requests go before all others, oldest first. So a long request waits behind at most
    `max_passes` later arrivals (or `max_debt_tokens` of their prompt), whatever keeps coming.
    """

    name = "quota"

    def __init__(self, max_passes: int = 8, max_debt_tokens: int = 16384) -> None:
        if max_passes < 0 or max_debt_tokens < 0:
            raise ConfigError(f"max_passes and max_debt_tokens must be >= 0, got {max_passes}, {max_debt_tokens}")
        self.max_passes = max_passes
        self.max_debt_tokens = max_debt_tokens
        self.passes: dict[str, int] = {}
        self.debt_tokens: dict[str, int] = {}

    def is_due(self, r: WaitingRequest) -> bool:
        return self.passes.get(r.request_id, 0) >= self.max_passes or self.debt_tokens.get(r.request_id, 0) >= self.max_debt_tokens

    def order(self, waiting: Sequence[WaitingRequest], now: float) -> list[WaitingRequest]:
        def rank(r: WaitingRequest) -> tuple[int, float, float, str]:
            if self.is_due(r):
                return (0, r.arrival_time, 0.0, r.request_id)
            return (1, float(r.num_prompt_tokens), r.arrival_time, r.request_id)

        return sorted(waiting, key=rank)

    def on_admit(self, admitted: WaitingRequest, still_waiting: Sequence[WaitingRequest], now: float) -> None:
        for r in still_waiting:
            if r.arrival_time < admitted.arrival_time or (
                r.arrival_time == admitted.arrival_time and r.request_id < admitted.request_id
            ):
                self.passes[r.request_id] = self.passes.get(r.request_id, 0) + 1
                self.debt_tokens[r.request_id] = self.debt_tokens.get(r.request_id, 0) + admitted.num_prompt_tokens
        self.on_remove(admitted)

    def on_remove(self, request: WaitingRequest) -> None:
        self.passes.pop(request.request_id, None)
        self.debt_tokens.pop(request.request_id, None)
