"""The vLLM connector's scheduler-side bookkeeping (pure Python, no vllm import): what to load and save.

Per request::

    get_num_new_matched_tokens -> hit_tokens   whole kvstore chunks held, capped so that vLLM still
                                               computes the prompt's last token
    update_state_after_alloc   -> LoadSpec      tokens [vLLM's computed, hit_tokens) into its blocks
    each scheduled step        -> SaveSpec      prompt chunks this step completes that the store lacks
    request_finished           -> state dropped (every computed prompt chunk was saved by then)

The specs travel to the worker in the step's connector metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvstore.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TransferSpec:
    """Tokens [start_token, end_token) of a request, in its blocks; `token_ids` are the prompt's first
    end_token tokens (they name the chunks), `block_ids` the request's blocks from token 0."""

    req_id: str
    token_ids: tuple[int, ...]
    start_token: int
    end_token: int
    block_ids: tuple[int, ...]


@dataclass(slots=True)
class StepPlan:
    """One engine step's work for the worker-side connector."""

    loads: list[TransferSpec] = field(default_factory=list)
    saves: list[TransferSpec] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """What the scheduler runs for a request this step."""

    req_id: str
    num_computed_tokens: int  # before this step
    num_scheduled_tokens: int
    block_ids: Sequence[int]


@dataclass(slots=True)
class _Request:
    prompt: tuple[int, ...]
    num_computed_tokens: int = 0
    hit_tokens: int = 0
    saved_tokens: int = 0


class ChunkPlanner:
    """Scheduler side of the vLLM connector. `lookup(prompt)` returns the leading tokens kvstore holds."""

    def __init__(self, lookup: Callable[[Sequence[int]], int], *, chunk_tokens: int, block_size: int) -> None:
        if chunk_tokens % block_size:
            raise ConfigError(f"kvstore chunk_tokens ({chunk_tokens}) must be a multiple of vLLM's block_size "
                              f"({block_size}); set kv_connector_extra_config chunk_tokens to k*{block_size}")
        self._lookup = lookup
        self.chunk_tokens = chunk_tokens
        self.block_size = block_size
        self._requests: dict[str, _Request] = {}
        self._loads: list[TransferSpec] = []

    def num_new_matched_tokens(self, req_id: str, prompt: Sequence[int], num_computed_tokens: int) -> int:
        """Tokens kvstore can supply beyond vLLM's own `num_computed_tokens` (looked up once per request)."""
        state = self._requests.get(req_id)
        if state is None:
            state = _Request(prompt=tuple(prompt))
            held = self._lookup(state.prompt)
            loadable = (len(state.prompt) - 1) // self.chunk_tokens * self.chunk_tokens
            state.hit_tokens = state.saved_tokens = min(held, loadable)
            self._requests[req_id] = state
        state.num_computed_tokens = num_computed_tokens
        return max(0, state.hit_tokens - num_computed_tokens)

    def after_alloc(self, req_id: str, block_ids: Sequence[int], num_external_tokens: int) -> None:
        """vLLM allocated blocks for `num_external_tokens` tokens to load: plan that load."""
        state = self._requests.get(req_id)
        if state is None or num_external_tokens <= 0:
            return
        start = state.num_computed_tokens
        end = start + num_external_tokens
        num_blocks = -(-end // self.block_size)
        self._loads.append(TransferSpec(req_id, state.prompt[:end], start, end, tuple(block_ids[:num_blocks])))

    def plan_step(self, scheduled: Sequence[ScheduledRequest]) -> StepPlan:
        """The loads planned since the last step, and the saves of chunks this step completes."""
        plan = StepPlan(loads=self._loads)
        self._loads = []
        for req in scheduled:
            state = self._requests.get(req.req_id)
            if state is None:
                continue
            done = min(req.num_computed_tokens + req.num_scheduled_tokens, len(state.prompt))
            end = done // self.chunk_tokens * self.chunk_tokens
            if end > state.saved_tokens:
                num_blocks = end // self.block_size
                plan.saves.append(TransferSpec(req.req_id, state.prompt[:end], state.saved_tokens, end,
                                               tuple(req.block_ids[:num_blocks])))
                state.saved_tokens = end
        return plan

    def finished(self, req_id: str) -> None:
        self._requests.pop(req_id, None)
