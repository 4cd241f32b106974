"""The vLLM connector's saves as BlockStored events (connector/vllm/kv_events.py), driven by the real scheduler-side
planner: one event per planned save of whole chunks, at the request's own block hashes, with its parent and its
tokens; a partial last chunk, an unknown request and a forgotten one give none. Encoded, the events decode as
vLLM's wire shape (tests/service/kv_event_subscriber.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from connector.vllm.kv_events import SavedBlockEvents
from connector.vllm.plan import ChunkPlanner, ScheduledRequest
from connector.vllm.vllm_types import VllmLoRARequest
from kvstore.hashing import ChunkHasher
from kvstore.kv_events import KVEventBatch, encode_batch
from tests.service.kv_event_subscriber import AllBlocksCleared
from tests.service.kv_event_subscriber import KVEventBatch as SubscriberBatch

BLOCK, CHUNK = 4, 8


@dataclass
class FakeRequest:
    """vllm.v1.request.Request's fields an event reads; block hashes chained over whole blocks as vLLM's are."""

    request_id: str
    all_token_ids: list[int]
    lora_request: VllmLoRARequest | None = None
    block_hashes: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        parent = b"root"
        for start in range(0, len(self.all_token_ids) // BLOCK * BLOCK, BLOCK):
            parent = hashlib.sha256(parent + bytes(self.all_token_ids[start:start + BLOCK])).digest()
            self.block_hashes.append(parent)


def _planner() -> ChunkPlanner[FakeRequest]:
    def keys_of(request: FakeRequest) -> ChunkHasher:
        hasher = ChunkHasher(b"\0" * 16, CHUNK)
        hasher.extend(request.all_token_ids)
        return hasher

    def nothing_held(keys: Sequence[bytes]) -> int:
        return 0

    return ChunkPlanner(keys_of, nothing_held, chunk_tokens=CHUNK, block_size=BLOCK, save_decode=False)


def _step(planner: ChunkPlanner[FakeRequest], events: SavedBlockEvents, req: FakeRequest, computed: int,
          scheduled: int) -> None:
    plan = planner.plan_step([ScheduledRequest(req.request_id, computed, scheduled, list(range(10)))])
    for spec in plan.saves:
        events.saved(spec.req_id, spec.start_token, spec.end_token)


def test_each_planned_save_is_one_event_at_the_requests_block_hashes() -> None:
    planner, events = _planner(), SavedBlockEvents(BLOCK, CHUNK)
    req = FakeRequest("r1", list(range(1, 21)))  # 20 tokens: 2 whole chunks (16 tokens, 4 blocks), a tail of 4
    events.track(req)
    assert planner.num_new_matched_tokens("r1", req, 20, 0) == 0
    _step(planner, events, req, 0, 10)  # computes 10 tokens: the first chunk is complete
    _step(planner, events, req, 10, 10)  # the rest: the second chunk; the tail is never a whole chunk
    first, second = events.take()
    assert (first.block_hashes, first.parent_block_hash, first.token_ids) == (req.block_hashes[0:2], None,
                                                                              req.all_token_ids[0:8])
    assert (second.block_hashes, second.parent_block_hash, second.token_ids) == (req.block_hashes[2:4],
                                                                                 req.block_hashes[1],
                                                                                 req.all_token_ids[8:16])
    assert (first.block_size, first.medium, first.ownership, first.group_idx) == (BLOCK, "CPU", "kvstore", 0)
    assert events.take() == []  # taken once
    wire = msgspec.msgpack.decode(encode_batch(KVEventBatch(ts=0.0, events=[first, second])), type=SubscriberBatch)
    assert [e.block_hashes for e in wire.events if not isinstance(e, AllBlocksCleared)] == [req.block_hashes[0:2],
                                                                                          req.block_hashes[2:4]]


def test_unknown_forgotten_and_partial_saves_give_no_event() -> None:
    events = SavedBlockEvents(BLOCK, CHUNK, medium="STORAGE")
    events.saved("never-seen", 0, 8)
    req = FakeRequest("r2", list(range(30, 42)))  # 12 tokens
    events.track(req)
    events.saved("r2", 8, 12)  # a partial chunk (save_tail's): its own key, no whole chunk
    events.forget("r2")
    events.saved("r2", 0, 8)
    assert events.take() == []
    events.track(req)
    events.saved("r2", 0, 12)
    (only,) = events.take()
    assert only.block_hashes == req.block_hashes[0:2] and only.medium == "STORAGE"
