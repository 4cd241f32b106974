"""`EventIndex`: which node's kvstore holds which chunk, kept from each node daemon's KV events
(service/kv_events.py, `[service.kv_events]`), and `EventRouter`, the proxy's prefix route over it: no Redis and
no call on a request's path.

One thread per node follows its daemon: a SUB socket for the live stream, a DEALER on the replay socket for what
it missed (everything from seq 0 when it starts, a gap's batches later). A daemon's restart starts its sequence
again with AllBlocksCleared: a live batch whose sequence number the view already holds with other bytes means
a new daemon, and the view is rebuilt from that daemon's seq 0. A subscriber that reconnects only after a
restarted daemon's first batches went out sees none of them; a stream quiet for QUIET_CHECK_S asks the replay
socket for the last batch it applied, which the same daemon still has unchanged and a new one does not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import httpx
import msgspec

from kvstore.hashing import chunk_keys
from kvstore.kv_events import AllBlocksCleared, BlockHash, BlockStored, KVEventBatch, block_hash
from service.pd_proxy.config import EventSource
from service.pd_proxy.metrics import ProxyMetrics

logger = logging.getLogger(__name__)
END_SEQ = (-1).to_bytes(8, "big", signed=True)
_RECENT = 256  # sequence numbers remembered to tell a replay's duplicate from a restarted daemon
_POLL_MS = 100
QUIET_CHECK_S = 2.0  # a live stream quiet this long: ask the replay socket whether the daemon restarted


class NodeView:
    """One node's held chunks (hash -> media holding a copy), applied batch by batch in sequence order."""

    def __init__(self) -> None:
        self.held: dict[BlockHash, set[str]] = {}
        self.last_seq = -1
        self._recent: OrderedDict[int, int] = OrderedDict()  # seq -> hash of its payload
        self._decode = msgspec.msgpack.Decoder(type=KVEventBatch).decode

    def is_duplicate(self, seq: int, payload: bytes) -> bool:
        return self._recent.get(seq) == hash(payload)

    def reset(self) -> None:
        self.held.clear()
        self.last_seq = -1
        self._recent.clear()

    def apply(self, seq: int, payload: bytes) -> None:
        if seq <= self.last_seq:
            return
        self.last_seq = seq
        self._recent[seq] = hash(payload)
        if len(self._recent) > _RECENT:
            self._recent.popitem(last=False)
        for event in self._decode(payload).events:
            if isinstance(event, AllBlocksCleared):
                self.held.clear()
                continue
            for h in event.block_hashes:
                media = self.held.setdefault(h, set())
                (media.add if isinstance(event, BlockStored) else media.discard)(event.medium or "")
                if not media:
                    del self.held[h]


class EventIndex:
    """The views of every node, each kept by its own thread; `prefix_chunks` reads them under one lock."""

    def __init__(self, sources: Sequence[EventSource]) -> None:
        import zmq

        self.sources = list(sources)
        self.views = {s.node_id: NodeView() for s in self.sources}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._context = zmq.Context()
        self._threads = [threading.Thread(target=self._follow, args=(s,), name=f"kv-events-{s.node_id}", daemon=True)
                         for s in self.sources]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        self._context.term()

    def prefix_chunks(self, keys: Sequence[bytes], node_ids: Sequence[str]) -> dict[str, int]:
        """How many leading `keys` each node holds (in any tier)."""
        found = {}
        with self._lock:
            for node_id in node_ids:
                view = self.views.get(node_id)
                n = 0
                while view is not None and n < len(keys) and _held(view, keys[n]):
                    n += 1
                found[node_id] = n
        return found

    def _follow(self, source: EventSource) -> None:
        import zmq

        sub = self._context.socket(zmq.SUB)
        replay = _ReplayClient(self._context, source.replay_endpoint)
        try:
            sub.connect(source.endpoint)
            sub.setsockopt_string(zmq.SUBSCRIBE, source.topic)
            view = self.views[source.node_id]
            self._catch_up(replay, view, 0)
            heard = time.monotonic()
            while not self._stop.is_set():
                if sub.poll(_POLL_MS):
                    _, seq_bytes, payload = sub.recv_multipart()
                    self._take_live(replay, view, int.from_bytes(seq_bytes, "big"), payload)
                    heard = time.monotonic()
                elif time.monotonic() - heard > QUIET_CHECK_S:
                    self._check(replay, view)
                    heard = time.monotonic()
        except Exception:  # the route falls back to load; the proxy keeps serving
            logger.exception("KV events of node %s: following stopped", source.node_id)
        finally:
            sub.close(linger=0)
            replay.close()

    def _take_live(self, replay: _ReplayClient, view: NodeView, seq: int, payload: bytes) -> None:
        with self._lock:
            restarted = seq <= view.last_seq and not view.is_duplicate(seq, payload)
            if restarted:
                view.reset()
        if restarted or seq > view.last_seq + 1:
            self._catch_up(replay, view, view.last_seq + 1)
        with self._lock:
            view.apply(seq, payload)

    def _check(self, replay: _ReplayClient, view: NodeView) -> None:
        """A quiet stream's check for a restart it did not see: a subscriber that reconnects after a restarted
        daemon published its first batches misses them, and nothing live may follow. Asks for the batches from
        the last one applied: the same daemon still has that one, unchanged (its window keeps the newest); a
        restarted daemon has another batch there, or none yet, and the view is rebuilt from its seq 0."""
        last = view.last_seq
        batches = replay.fetch(max(last, 0))
        if batches is None:  # no answer: the daemon is down; asked again after the next quiet spell
            return
        restarted = last >= 0 and (not batches or (batches[0][0] == last and not view.is_duplicate(*batches[0])))
        with self._lock:
            if restarted:
                logger.info("KV events: a restarted daemon found by a quiet-stream check; rebuilding its view")
                view.reset()
                batches = []
            for seq, payload in batches:
                view.apply(seq, payload)
        if restarted:
            self._catch_up(replay, view, 0)

    def _catch_up(self, replay: _ReplayClient, view: NodeView, start: int) -> None:
        """The batches the daemon still has from `start` on, applied in order."""
        for seq, payload in replay.fetch(start) or []:
            with self._lock:
                view.apply(seq, payload)


class _ReplayClient:
    """A DEALER on a daemon's replay socket. A request the daemon does not answer in time (it is down) is
    dropped with the socket, so a late answer never passes for the answer to a later request."""

    def __init__(self, context: object, endpoint: str) -> None:
        self._context = context
        self._endpoint = endpoint
        self._socket = self._connect()

    def _connect(self) -> Any:
        import zmq

        assert isinstance(self._context, zmq.Context)
        socket = self._context.socket(zmq.DEALER)
        socket.connect(self._endpoint)
        return socket

    def fetch(self, start: int, timeout_ms: int = 2000) -> list[tuple[int, bytes]] | None:
        """The daemon's batches from `start` on, in order (empty: none); None when it did not answer."""
        import zmq

        try:
            self._socket.send_multipart([b"", start.to_bytes(8, "big")], flags=zmq.NOBLOCK)
        except zmq.Again:  # no connection to queue on
            return None
        batches: list[tuple[int, bytes]] = []
        while self._socket.poll(timeout_ms):
            frames = self._socket.recv_multipart()
            if len(frames) != 4 or frames[2] == END_SEQ:
                return batches
            batches.append((int.from_bytes(frames[2], "big"), frames[3]))
        self.close()
        self._socket = self._connect()
        return None

    def close(self) -> None:
        self._socket.close(linger=0)


def _held(view: NodeView, key: bytes) -> bool:
    return key in view.held or block_hash(key, as_int=True) in view.held  # a daemon with int_block_hashes


class EventRouter:
    """The pd-proxy's route from an EventIndex: the node holding the longest prefix of a token-id prompt.

    Keys are computed as the daemon's anonymous namespace does (root key and chunk size from `info_url`'s
    `/v1/info`, asked once); a tenant's store keys are salted and not computable here (use the cluster route)."""

    def __init__(self, index: EventIndex, client: httpx.AsyncClient, info_url: str, *, token: str | None,
                 timeout_s: float, metrics: ProxyMetrics) -> None:
        self.index = index
        self.client = client
        self.info_url = info_url.rstrip("/") + "/v1/info"
        self.headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        self.timeout_s = timeout_s
        self.metrics = metrics
        self._namespace: tuple[bytes, int] | None = None

    async def node_for(self, token_ids: list[int], node_ids: list[str]) -> str | None:
        namespace = self._namespace or await self._fetch_namespace()
        if namespace is None:
            return None
        root_key, chunk_tokens = namespace
        found = self.index.prefix_chunks(chunk_keys(token_ids, root_key, chunk_tokens), node_ids)
        self.metrics.count("route_calls", outcome="events")
        best = max(node_ids, key=lambda n: found.get(n, 0), default=None)
        return best if best is not None and found.get(best, 0) > 0 else None

    async def _fetch_namespace(self) -> tuple[bytes, int] | None:
        try:
            response = await self.client.get(self.info_url, headers=self.headers, timeout=self.timeout_s)
            response.raise_for_status()
            info = response.json()
            self._namespace = bytes.fromhex(info["root_key"]), int(info["layout"]["chunk_tokens"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self.metrics.count("route_calls", outcome="failed")
            logger.debug("kvstore /v1/info failed (%s): choosing by load", exc)
            return None
        return self._namespace
