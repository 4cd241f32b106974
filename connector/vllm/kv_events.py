"""`SavedBlockEvents`: the blocks the connector saves to kvstore as `BlockStored` events at vLLM's block size and
block hashes, for vLLM to publish with its own through `KVConnector.take_events()` (pure Python, no vllm import).

A KV-aware router (llm-d, Dynamo) matches a prompt against vLLM's block hashes; kvstore's chunk keys are its own.
This turns each planned save of whole chunks into one BlockStored per request and step: the blocks' hashes in
prefix order, the first one's parent, their token ids, medium "CPU" unless configured (`kv_events_medium`) and
ownership "kvstore". The connector does not hear of kvstore's evictions, so it publishes no BlockRemoved: the
daemon's own stream (service/kv_events.py, kvstore chunk keys) says what kvstore loses.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

from connector.vllm.vllm_types import VllmLoRARequest
from kvstore.kv_events import OWNERSHIP, BlockStored

MAX_PENDING_EVENTS = 4096  # events vLLM has not taken yet; past it the oldest go (counted in `dropped`)


class HashedRequest(Protocol):
    """vllm.v1.request.Request: the fields an event needs (its block hashes, one per full block)."""

    @property
    def request_id(self) -> str: ...
    @property
    def block_hashes(self) -> Sequence[bytes]: ...
    @property
    def all_token_ids(self) -> Sequence[int]: ...
    @property
    def lora_request(self) -> VllmLoRARequest | None: ...


class SavedBlockEvents:
    """Requests seen by the scheduler half (`track` .. `forget`) and the events of their saves (`saved`, `take`)."""

    def __init__(self, block_size: int, chunk_tokens: int, *, medium: str = "CPU") -> None:
        self.block_size = block_size
        self.chunk_tokens = chunk_tokens
        self.medium = medium
        self.dropped = 0
        self._requests: dict[str, HashedRequest] = {}
        self._events: deque[BlockStored] = deque()

    def track(self, request: HashedRequest) -> None:
        self._requests[request.request_id] = request

    def forget(self, req_id: str) -> None:
        self._requests.pop(req_id, None)

    def saved(self, req_id: str, start_token: int, end_token: int) -> None:
        """Tokens [start_token, end_token) of a request were planned into kvstore: an event for the whole chunks'
        blocks (a partial last chunk travels under a key of its own that only a handoff names: no event)."""
        request = self._requests.get(req_id)
        if request is None:
            return
        first = start_token // self.block_size
        last = min(end_token // self.chunk_tokens * self.chunk_tokens // self.block_size, len(request.block_hashes))
        if last <= first:
            return
        hashes: list[bytes | int] = list(request.block_hashes[first:last])
        lora = request.lora_request
        if len(self._events) >= MAX_PENDING_EVENTS:
            self._events.popleft()
            self.dropped += 1
        self._events.append(BlockStored(
            block_hashes=hashes, parent_block_hash=request.block_hashes[first - 1] if first else None,
            token_ids=list(request.all_token_ids[first * self.block_size:last * self.block_size]),
            block_size=self.block_size, lora_id=None, medium=self.medium,
            lora_name=lora.lora_name if lora is not None else None, group_idx=0, ownership=OWNERSHIP))

    def take(self) -> list[BlockStored]:
        """The events since the last call, oldest first."""
        events = list(self._events)
        self._events.clear()
        return events
