"""The vLLM connector's scheduler-side bookkeeping (pure Python, no vllm import): what to load and save.

Per request::

    get_num_new_matched_tokens -> hit_tokens   whole kvstore chunks held, capped so that vLLM still
                                               computes the prompt's last token
    update_state_after_alloc   -> LoadSpec      tokens [vLLM's computed, hit_tokens) into its blocks
    each scheduled step        -> SaveSpec      prompt chunks this step completes that the store lacks
    request_finished           -> state dropped (every computed prompt chunk was saved by then)

A request's chunk keys are computed once, when it is first seen (under its scope: model, LoRA adapter,
salt; see kvstore.kv_scope), and its lookup is asked once: a waiting request asked again touches only
this planner's dict. The specs carry the keys to the worker in the step's connector metadata, so the
worker hashes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvstore.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TransferSpec:
    """Tokens [start_token, end_token) of a request, in its blocks. `keys` name the chunks from
    `first_chunk` on (chunk i covers tokens [i*chunk_tokens, (i+1)*chunk_tokens)); `block_ids` are the
    request's blocks from token 0."""

    req_id: str
    keys: tuple[bytes, ...]
    first_chunk: int
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
    keys: list[bytes]  # the prompt's whole chunks
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    hit_tokens: int = 0
    saved_tokens: int = 0


class ChunkPlanner:
    """Scheduler side of the vLLM connector.

    Args:
        keys_of: a new request's prompt chunk keys (called once per request; None = never cached, e.g.
            a prompt given as embeddings).
        lookup: how many leading keys the store holds.
    """

    def __init__(self, keys_of: Callable[[object], list[bytes] | None], lookup: Callable[[Sequence[bytes]], int], *,
                 chunk_tokens: int, block_size: int) -> None:
        if chunk_tokens % block_size:
            raise ConfigError(f"kvstore chunk_tokens ({chunk_tokens}) must be a multiple of vLLM's block_size "
                              f"({block_size}); set kv_connector_extra_config chunk_tokens to k*{block_size}")
        self._keys_of = keys_of
        self._lookup = lookup
        self.chunk_tokens = chunk_tokens
        self.block_size = block_size
        self._requests: dict[str, _Request] = {}
        self._loads: list[TransferSpec] = []

    def num_new_matched_tokens(self, req_id: str, request: object, num_prompt_tokens: int,
                               num_computed_tokens: int) -> int:
        """Tokens kvstore can supply beyond vLLM's own `num_computed_tokens` (looked up once per request)."""
        state = self._requests.get(req_id)
        if state is None:
            keys = self._keys_of(request)
            state = _Request(keys=keys or [], num_prompt_tokens=num_prompt_tokens)
            if keys is None:  # uncacheable: nothing loaded, nothing saved
                state.saved_tokens = num_prompt_tokens
            else:
                loadable = (num_prompt_tokens - 1) // self.chunk_tokens
                held = self._lookup(keys[:loadable]) if loadable else 0
                state.hit_tokens = state.saved_tokens = held * self.chunk_tokens
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
        self._loads.append(self._spec(req_id, state, start, end, block_ids))

    def _spec(self, req_id: str, state: _Request, start: int, end: int, block_ids: Sequence[int]) -> TransferSpec:
        first, last = start // self.chunk_tokens, -(-end // self.chunk_tokens)
        num_blocks = -(-end // self.block_size)
        return TransferSpec(req_id, tuple(state.keys[first:last]), first, start, end, tuple(block_ids[:num_blocks]))

    def plan_step(self, scheduled: Sequence[ScheduledRequest]) -> StepPlan:
        """The loads planned since the last step, and the saves of chunks this step completes."""
        plan = StepPlan(loads=self._loads)
        self._loads = []
        for req in scheduled:
            state = self._requests.get(req.req_id)
            if state is None:
                continue
            done = min(req.num_computed_tokens + req.num_scheduled_tokens, state.num_prompt_tokens)
            end = min(done // self.chunk_tokens, len(state.keys)) * self.chunk_tokens
            if end > state.saved_tokens:
                plan.saves.append(self._spec(req.req_id, state, state.saved_tokens, end, req.block_ids))
                state.saved_tokens = end
        return plan

    def finished(self, req_id: str) -> None:
        self._requests.pop(req_id, None)
