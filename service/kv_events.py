"""`KVEventPublisher`: the daemon's store changes as vLLM-compatible KV events on a ZMQ PUB socket, with replay.

    store listener (any thread)        bounded queue            publisher thread (one)
    stored/removed (key, tier)  --put_nowait-->  [changes]  -->  KVEventBatch -> PUB (topic, seq, payload)
                    queue full: dropped, counted, resync           replay window (last N batches, bytes capped)
                                                                   ROUTER: [id, "", start seq] -> batches >= start,
                                                                           then [id, "", "", -1, ""]

What is published (kvstore/kv_events.py has the wire shape):
- a copy landing in a tier: `BlockStored`, one per chunk key, medium = the tier (kvstore.kv_events.TIER_MEDIUM),
  block_size = the layout's chunk_tokens, token_ids [] and no parent (a put names keys, never tokens);
- a copy leaving a tier (eviction, demotion's source, removal, a corrupt copy dropped): `BlockRemoved` with that
  tier's medium; a chunk gone from every tier has had one removal per tier that held it;
- at start, after any drop, and after a replay asked from before the window: `AllBlocksCleared`, then a
  `BlockStored` for every copy the index holds, so a subscriber's view is whole again. The sequence number
  restarts at 0 with the daemon (whose first batch is that AllBlocksCleared).

The listener never blocks the store: a full queue drops the change and counts it (`kv_events_dropped`).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NamedTuple

from kvstore.errors import ConfigError
from kvstore.hashing import ChunkKey
from kvstore.kv_events import (
    OWNERSHIP,
    TIER_MEDIUM,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    block_hash,
    encode_batch,
)
from kvstore.stats import Counters
from kvstore.types import StoreEvent, TierKind
from service.kv_events_config import KVEventsConfig

if TYPE_CHECKING:
    import zmq

    from kvstore.store import TieredStore

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)  # vLLM's end-of-replay marker
_IDLE_S = 0.05  # how long the thread waits for a change before it looks at the replay socket again

Snapshot = Callable[[], list[tuple[ChunkKey, list[TierKind]]]]


class _Change(NamedTuple):
    kind: str  # "stored" | "removed"
    key: ChunkKey
    tier: TierKind


class KVEventPublisher:
    """Binds its sockets at construction (a bad or busy endpoint fails the daemon's start in one line);
    `attach(store)` starts publishing; `close()` stops the thread and closes the sockets."""

    def __init__(self, config: KVEventsConfig, *, block_size: int) -> None:
        import zmq

        self.config = config
        self.block_size = block_size
        self.counters = Counters()  # the store's once attached: its stats and /metrics show them
        self._queue: queue.Queue[_Change] = queue.Queue(maxsize=config.max_queue_events)
        self._window: deque[tuple[int, bytes]] = deque()
        self._window_bytes = 0
        self._seq = 0
        self._resync = threading.Event()
        self._stop = threading.Event()
        self._snapshot: Snapshot = list
        self._ctx = zmq.Context()
        self._pub = self._bind(zmq.PUB, config.endpoint)
        self._pub.set_hwm(100_000)
        self._replay = None if config.replay_endpoint is None else self._bind(zmq.ROUTER, config.replay_endpoint)
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)

    def _bind(self, kind: int, endpoint: str) -> zmq.Socket[bytes]:
        import zmq

        sock: zmq.Socket[bytes] = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            self._ctx.term()
            raise ConfigError(f"service.kv_events: cannot bind {endpoint} ({exc}); free it or choose another "
                              "endpoint") from None
        if endpoint.startswith("ipc://"):
            os.chmod(endpoint[len("ipc://"):], 0o600)  # the operator's stream: this user only
        return sock

    # ----- the store's side -------------------------------------------------------------------
    def attach(self, store: TieredStore) -> None:
        """Listen to the store, announce what it holds (AllBlocksCleared, then every held copy), start."""
        self.counters = store.stats_counters
        self._snapshot = store.resident_keys
        store.add_listener(self.on_store_event)
        self._resync.set()
        self._thread.start()
        logger.info("KV events on %s (replay %s, topic %r)", self.config.endpoint, self.config.replay_endpoint,
                    self.config.topic)

    def on_store_event(self, event: StoreEvent) -> None:
        """The store listener: queue the change, or count it dropped and ask for a resync. Never blocks."""
        if event.kind not in ("stored", "removed"):
            return
        try:
            self._queue.put_nowait(_Change(event.kind, event.key, event.tier))
        except queue.Full:
            self.counters.incr("kv_events_dropped")
            self._resync.set()

    def resync(self) -> None:
        """Publish `AllBlocksCleared` and then every held copy (e.g. for a subscriber past the replay window)."""
        self._resync.set()

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the thread and close the sockets; a second call does nothing."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()

    # ----- the publisher thread ---------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._serve_replays()
                if self._resync.is_set():
                    self._publish_resync()
                    continue
                changes = self._next_changes()
                if changes:
                    self._publish(list(self._events(changes)))
            except Exception:  # a publisher bug must not end the stream silently: log, go on
                logger.exception("KV event publisher failed; going on")
                time.sleep(_IDLE_S)

    def _next_changes(self) -> list[_Change]:
        try:
            changes = [self._queue.get(timeout=_IDLE_S)]
        except queue.Empty:
            return []
        while len(changes) < self.config.max_batch_events:
            try:
                changes.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return changes

    def _events(self, changes: list[_Change]) -> Iterator[KVEvent]:
        """One BlockStored per key (a list of hashes would claim a prefix chain kvstore does not know); removals
        of one medium in a row share a BlockRemoved."""
        removed: list[bytes | int] = []
        removed_medium = ""
        for change in changes:
            medium = TIER_MEDIUM[change.tier]
            if removed and (change.kind != "removed" or medium != removed_medium):
                yield self._removed(removed, removed_medium)
                removed = []
            if change.kind == "stored":
                yield self._stored(change.key, medium)
            else:
                removed.append(block_hash(change.key, as_int=self.config.int_block_hashes))
                removed_medium = medium
        if removed:
            yield self._removed(removed, removed_medium)

    def _stored(self, key: ChunkKey, medium: str) -> BlockStored:
        return BlockStored(block_hashes=[block_hash(key, as_int=self.config.int_block_hashes)], parent_block_hash=None,
                           token_ids=[], block_size=self.block_size, lora_id=None, medium=medium, lora_name=None,
                           ownership=OWNERSHIP)

    @staticmethod
    def _removed(hashes: list[bytes | int], medium: str) -> BlockRemoved:
        return BlockRemoved(block_hashes=hashes, medium=medium, ownership=OWNERSHIP)

    def _publish_resync(self) -> None:
        """Changes queued before the snapshot are in it (or were undone before it): drop them, then clear and
        announce every held copy. Changes queued after are published after, so nothing is lost for good."""
        self._resync.clear()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._publish([AllBlocksCleared()])
        held = [_Change("stored", key, tier) for key, tiers in self._snapshot() for tier in tiers]
        step = self.config.max_batch_events
        for start in range(0, len(held), step):
            self._publish(list(self._events(held[start:start + step])))
            self._serve_replays()
        self.counters.incr("kv_events_resyncs")

    def _publish(self, events: list[KVEvent]) -> None:
        payload = encode_batch(KVEventBatch(ts=time.time(), events=events))
        seq = self._seq
        self._seq += 1
        self._pub.send_multipart((self.config.topic.encode(), seq.to_bytes(8, "big"), payload))
        self._window.append((seq, payload))
        self._window_bytes += len(payload)
        while len(self._window) > self.config.replay_batches or self._window_bytes > self.config.replay_bytes:
            self._window_bytes -= len(self._window.popleft()[1])
        self.counters.incr("kv_events_batches")
        self.counters.incr("kv_events_published", len(events))

    def _serve_replays(self) -> None:
        """Answer every waiting replay request: the window's batches from the asked sequence number on."""
        if self._replay is None:
            return
        while self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                logger.warning("KV events: a replay request of %d frames ignored (expected [id, '', seq])", len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            topic = self.config.topic.encode()
            for seq, payload in self._window:
                if seq >= first:
                    self._replay.send_multipart((client, b"", topic, seq.to_bytes(8, "big"), payload))
            self._replay.send_multipart((client, b"", b"", END_SEQ, b""))
            self.counters.incr("kv_events_replays")
            oldest = self._window[0][0] if self._window else self._seq
            if first < oldest:  # batches it missed are gone: a resync on the live stream makes its view whole
                self._resync.set()
