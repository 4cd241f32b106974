"""The vLLM connector's scheduler-side bookkeeping (pure Python, no vllm import): what to load and save.

Per request::

    get_num_new_matched_tokens -> hit_tokens   whole kvstore chunks held, capped so that vLLM still
                                               computes the prompt's last token
    update_state_after_alloc   -> LoadSpec      tokens [vLLM's computed, hit_tokens) into its blocks
    each scheduled step        -> SaveSpec      prompt chunks this step completes that the store lacks
    request_finished           -> SaveSpec      (save_decode) the chunks the model's answer filled, saved
                                               in the next step while vLLM keeps the blocks; then dropped
                               -> Handoff       (a producer) the prompt chunks it saved, for a decode instance

Roles (vLLM's kv_role): a producer saves and never loads, a consumer loads and never saves. A handoff is
how a prefill instance's saves reach a decode instance without a race: the prefill answer names how many
prompt chunks it saved and the last one's key (connector.vllm.handoff); a consumer given that handoff
counts those chunks as hits even while they are still on their way to the store, and its load waits a
bounded time (`handoff_wait_s`) for them before reading. What does not arrive in time is recomputed.
A producer also saves the prompt's partial last chunk under its own key (save_tail), so the decode
instance computes only the prompt's last token (`kvstore bench pd_tail` measured recomputing that tail
at 5-9x the cost of moving it).

A request's chunk keys are computed once, when it is first seen (under its scope: model, LoRA adapter,
salt; see kvstore.kv_scope), and its lookup is asked once: a waiting request asked again touches only
this planner's dict. At the end its chain is extended with the generated tokens only. The specs carry
the keys to the worker in the step's connector metadata, so the worker hashes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from connector.vllm.handoff import Handoff
from kvstore.errors import ConfigError
from kvstore.hashing import ChunkHasher

RequestT = TypeVar("RequestT")  # the engine's request object, handed back to keys_of


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
    wait_s: float = 0.0  # announced by a prefill instance and maybe still in flight: wait this long for them
    background: bool = True  # a load: on a loader thread (vLLM was told it is asynchronous), else in the step


@dataclass(slots=True)
class StepPlan:
    """One engine step's work for the worker-side connector."""

    loads: list[TransferSpec] = field(default_factory=list)
    saves: list[TransferSpec] = field(default_factory=list)
    finished_saves: list[str] = field(default_factory=list)  # finished requests whose blocks wait for these saves
    idle: bool = False  # vLLM scheduled no token this step: the worker may wait a moment for a background load


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """What the scheduler runs for a request this step."""

    req_id: str
    num_computed_tokens: int  # before this step
    num_scheduled_tokens: int
    block_ids: Sequence[int]


@dataclass(slots=True)
class _Request:
    hasher: ChunkHasher | None  # the chain so far (its .keys); None: never cached (e.g. prompt embeddings)
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    hit_tokens: int = 0
    saved_tokens: int = 0
    wait_s: float = 0.0
    tail_key: bytes | None = None  # the prompt's tokens after its whole chunks (hashing.ChunkHasher.tail_key)
    tail_saved: bool = False  # a producer saved the tail as a chunk of its own (save_tail)
    tail_loadable: bool = False  # a consumer was handed that tail
    background: bool = True  # its load runs on a loader thread (what vLLM was last told: asynchronous)

    @property
    def keys(self) -> list[bytes]:
        return self.hasher.keys if self.hasher is not None else []


class ChunkPlanner(Generic[RequestT]):
    """Scheduler side of the vLLM connector.

    Args:
        keys_of: a new request's key chain over its prompt (called once per request; None = never cached,
            e.g. a prompt given as embeddings).
        lookup: how many leading keys the store holds.
        save_decode: also save the chunks that generated tokens fill (a conversation's next turn then hits
            the model's answers too).
        loads, saves: the role (vLLM's kv_role): a producer never loads, a consumer never saves.
        handoff_wait_s: how long a load waits for chunks a prefill instance announced (connector.vllm.handoff).
        save_tail: a producer also saves each prompt's partial last chunk, for the decode instance to load
            (its own key; useful only to a handoff, so off unless this instance is a prefill instance).
    """

    def __init__(self, keys_of: Callable[[RequestT], ChunkHasher | None], lookup: Callable[[Sequence[bytes]], int], *,
                 chunk_tokens: int, block_size: int, save_decode: bool = True, loads: bool = True,
                 saves: bool = True, handoff_wait_s: float = 5.0, save_tail: bool = False) -> None:
        if chunk_tokens % block_size:
            raise ConfigError(f"kvstore chunk_tokens ({chunk_tokens}) must be a multiple of vLLM's block_size "
                              f"({block_size}); set kv_connector_extra_config chunk_tokens to k*{block_size}")
        self._keys_of = keys_of
        self._lookup = lookup
        self.chunk_tokens = chunk_tokens
        self.block_size = block_size
        self.save_decode = save_decode and saves
        self.loads, self.saves, self.handoff_wait_s = loads, saves, handoff_wait_s
        self.save_tail = save_tail and saves
        self._requests: dict[str, _Request] = {}
        self._loads: list[TransferSpec] = []
        self._finish_saves: list[TransferSpec] = []

    def num_new_matched_tokens(self, req_id: str, request: RequestT, num_prompt_tokens: int,
                               num_computed_tokens: int, handoff: Handoff | None = None) -> int:
        """Tokens kvstore can supply beyond vLLM's own `num_computed_tokens` (looked up once per request).
        A prompt's whole chunks are loadable up to its last token, which vLLM always computes itself."""
        state = self._requests.get(req_id)
        if state is None:
            state = self._first_look(request, num_prompt_tokens, handoff)
            self._requests[req_id] = state
        state.num_computed_tokens = num_computed_tokens
        return max(0, state.hit_tokens - num_computed_tokens)

    def _first_look(self, request: RequestT, num_prompt_tokens: int, handoff: Handoff | None) -> _Request:
        state = _Request(hasher=self._keys_of(request), num_prompt_tokens=num_prompt_tokens)
        if state.hasher is None:  # uncacheable: nothing loaded, nothing saved
            state.saved_tokens = num_prompt_tokens
            return state
        state.tail_key = state.hasher.tail_key()
        whole = min(num_prompt_tokens // self.chunk_tokens, len(state.keys))
        held = self._lookup(state.keys[:whole]) if whole else 0
        if self.loads and handoff is not None and handoff.matches(state.keys):
            if handoff.chunks > held:
                held, state.wait_s = min(handoff.chunks, whole), self.handoff_wait_s  # in flight: the load waits
            if held == whole and handoff.tail_key and handoff.tail_key == state.tail_key:
                state.tail_loadable, state.wait_s = True, self.handoff_wait_s
        state.saved_tokens = held * self.chunk_tokens
        if self.loads:
            tail = num_prompt_tokens - whole * self.chunk_tokens if state.tail_loadable else 0
            state.hit_tokens = min(state.saved_tokens + tail, num_prompt_tokens - 1)
        return state

    def load_wait_s(self, req_id: str) -> float:
        """How long this request's load may wait for chunks a prefill instance announced (0: none announced)."""
        state = self._requests.get(req_id)
        return state.wait_s if state is not None else 0.0

    def load_in_background(self, req_id: str, background: bool) -> None:
        """Record how vLLM was told this request's load runs (asynchronously, or in the step that admits it)."""
        state = self._requests.get(req_id)
        if state is not None:
            state.background = background

    def handoff(self, req_id: str) -> Handoff | None:
        """What a decode instance needs to hear about this request's saved prompt chunks (None: nothing saved)."""
        state = self._requests.get(req_id)
        if state is None or state.hasher is None or not self.saves:
            return None
        chunks = min(state.saved_tokens, state.num_prompt_tokens) // self.chunk_tokens
        last = state.keys[chunks - 1] if chunks else b""
        if state.tail_saved and state.tail_key is not None:
            return Handoff(chunks, last, state.num_prompt_tokens % self.chunk_tokens, state.tail_key)
        return Handoff(chunks, last) if chunks else None

    def after_alloc(self, req_id: str, block_ids: Sequence[int], num_external_tokens: int) -> None:
        """vLLM allocated blocks for `num_external_tokens` tokens to load: plan that load."""
        state = self._requests.get(req_id)
        if state is None or num_external_tokens <= 0:
            return
        start = state.num_computed_tokens
        end = start + num_external_tokens
        self._loads.append(self._spec(req_id, state, start, end, block_ids, background=state.background))

    def _spec(self, req_id: str, state: _Request, start: int, end: int, block_ids: Sequence[int], *,
              background: bool = True) -> TransferSpec:
        first, last = start // self.chunk_tokens, -(-end // self.chunk_tokens)
        num_blocks = -(-end // self.block_size)
        keys = state.keys[first:last]
        if last > len(state.keys) and state.tail_key is not None:  # the prompt's partial last chunk
            keys = [*keys, state.tail_key]
        return TransferSpec(req_id, tuple(keys), first, start, end, tuple(block_ids[:num_blocks]), state.wait_s,
                            background)

    def plan_step(self, scheduled: Sequence[ScheduledRequest]) -> StepPlan:
        """The loads planned since the last step, and the saves of chunks this step completes."""
        plan = StepPlan(loads=self._loads, saves=self._finish_saves,
                        finished_saves=[spec.req_id for spec in self._finish_saves],
                        idle=not any(req.num_scheduled_tokens for req in scheduled))
        self._loads, self._finish_saves = [], []
        for req in scheduled if self.saves else ():
            state = self._requests.get(req.req_id)
            if state is None:
                continue
            done = min(req.num_computed_tokens + req.num_scheduled_tokens, state.num_prompt_tokens)
            end = min(done // self.chunk_tokens, len(state.keys)) * self.chunk_tokens
            if end > state.saved_tokens:
                plan.saves.append(self._spec(req.req_id, state, state.saved_tokens, end, req.block_ids))
                state.saved_tokens = end
            if self.save_tail and done == state.num_prompt_tokens and self._tail_unsaved(state):
                whole = state.num_prompt_tokens // self.chunk_tokens * self.chunk_tokens
                plan.saves.append(self._spec(req.req_id, state, whole, done, req.block_ids))
                state.tail_saved = True
        return plan

    def _tail_unsaved(self, state: _Request) -> bool:
        return (state.tail_key is not None and not state.tail_saved
                and state.saved_tokens == state.num_prompt_tokens // self.chunk_tokens * self.chunk_tokens)

    def finished(self, req_id: str, all_token_ids: Sequence[int], num_computed_tokens: int,
                 block_ids: Sequence[int]) -> bool:
        """The request is done. With save_decode, plan the save of the whole chunks its generated tokens
        filled (KV exists for its first `num_computed_tokens` tokens); True when that save still needs
        `block_ids` (vLLM keeps them until the worker reports the request in `finished_saves`)."""
        state = self._requests.pop(req_id, None)
        if state is None or state.hasher is None or not self.save_decode:
            return False
        computed = min(num_computed_tokens, len(all_token_ids))
        if computed // self.chunk_tokens * self.chunk_tokens <= state.saved_tokens:
            return False
        state.hasher.extend(all_token_ids[state.hasher.num_tokens:computed])
        end = min(computed // self.chunk_tokens, len(state.keys)) * self.chunk_tokens
        self._finish_saves.append(self._spec(req_id, state, state.saved_tokens, end, block_ids))
        return True
