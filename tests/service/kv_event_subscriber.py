"""An independent KV event subscriber, written the way vLLM's example subscriber is: its own msgspec types
(vLLM 0.32's wire shape, not kvstore's module), a SUB socket reading (topic, seq, payload) frames, gaps filled
from the replay socket. It replays over a DEALER socket (one request, many answers, an end marker); the
example's REQ socket would take only the first answer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
from msgspec.msgpack import Decoder

ExternalBlockHash = bytes | int


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    ownership: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


END_SEQ = -1


class Subscriber:
    """Everything received, in sequence order: `batches` [(seq, batch)], and `held`, the view a router keeps:
    (hash, medium) pairs stored and not removed since the last AllBlocksCleared."""

    def __init__(self, endpoint: str, replay_endpoint: str, topic: str = "kv-events") -> None:
        self.context = zmq.Context()
        self.sub = self.context.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        self.replay = self.context.socket(zmq.DEALER)
        self.replay.connect(replay_endpoint)
        self.decoder = Decoder(type=KVEventBatch)
        self.last_seq = -1
        self.batches: list[tuple[int, KVEventBatch]] = []
        self.replayed_seqs: list[int] = []
        self.held: set[tuple[ExternalBlockHash, str | None]] = set()

    def close(self) -> None:
        self.sub.close(linger=0)
        self.replay.close(linger=0)
        self.context.term()

    def _take(self, seq: int, payload: bytes) -> None:
        if seq <= self.last_seq:
            return  # already had it (a replay overlapping the live stream)
        batch = self.decoder.decode(payload)
        self.batches.append((seq, batch))
        self.last_seq = seq
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.held.clear()
            elif isinstance(event, BlockStored):
                self.held.update((h, event.medium) for h in event.block_hashes)
            else:
                self.held.difference_update((h, event.medium) for h in event.block_hashes)

    def request_replay(self, start_seq: int, timeout_s: float = 5.0) -> int:
        """Every batch the publisher still has from `start_seq` on; returns how many came."""
        self.replay.send_multipart([b"", start_seq.to_bytes(8, "big")])
        count = 0
        while self.replay.poll(int(timeout_s * 1000)):
            _, _, seq_bytes, payload = self.replay.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == END_SEQ:
                return count
            self.replayed_seqs.append(seq)
            self._take(seq, payload)
            count += 1
        raise TimeoutError(f"no end of replay from {start_seq} within {timeout_s} s")

    def poll(self, timeout_ms: int = 100) -> bool:
        """One live batch (a gap before it filled from the replay socket first); False when none came."""
        if not self.sub.poll(timeout_ms):
            return False
        _, seq_bytes, payload = self.sub.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big")
        if seq > self.last_seq + 1:
            self.request_replay(self.last_seq + 1)
        self._take(seq, payload)
        return True

    def wait_for(self, done: Callable[[Subscriber], bool], timeout_s: float = 20.0) -> None:
        """Read until `done(self)`; when the stream is quiet, ask the replay socket for anything missed (a batch
        sent before this SUB's subscription reached the publisher never arrives live)."""
        end = time.monotonic() + timeout_s
        while not done(self):
            if time.monotonic() > end:
                raise TimeoutError(f"condition not met in {timeout_s} s; last seq {self.last_seq}, "
                                   f"{len(self.batches)} batches")
            if not self.poll():
                self.request_replay(self.last_seq + 1)

    def events(self, kind: type) -> list[Any]:
        return [e for _, b in self.batches for e in b.events if isinstance(e, kind)]
