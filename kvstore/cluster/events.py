"""The KV event stream: a Redis Stream of stored/evicted batches per node and tier, for external routers.

Each entry (XADD ... MAXLEN ~ N) carries one batch of one node, one kind and one tier:

    node=<node id>  kind=stored|evicted|resync  tier=host|nvme|pfs|...  count=<n>  keys=<n x 16 bytes>

"evicted" means the tier no longer holds the chunk (eviction, demotion, delete). "resync" says
the node rewrote its whole index entry (after Redis was down or events were dropped): a consumer
should re-read that node's index (`ClusterIndex.node_chunks`) instead of trusting its own replay.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvstore.cluster.config import ClusterKeys
from kvstore.hashing import KEY_BYTES
from kvstore.types import TierKind

logger = logging.getLogger(__name__)

STORE_TO_STREAM_KIND = {"stored": "stored", "removed": "evicted"}


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """One chunk event as a consumer sees it (a "resync" event has no tier and no key)."""

    entry_id: str
    node_id: str
    kind: str
    tier: TierKind | None
    key: bytes | None


def append_batches(pipe: Any, keys: ClusterKeys, node_id: str, groups: dict[tuple[str, TierKind], list[bytes]],
                   maxlen: int) -> None:
    """Queue one XADD per (kind, tier) group on `pipe`; store kinds map to stream kinds."""
    for (store_kind, tier), chunk_keys in groups.items():
        fields = {"node": node_id, "kind": STORE_TO_STREAM_KIND.get(store_kind, store_kind), "tier": tier.value,
                  "count": len(chunk_keys), "keys": b"".join(chunk_keys)}
        pipe.xadd(keys.events, fields, maxlen=maxlen, approximate=True)


def append_resync(pipe: Any, keys: ClusterKeys, node_id: str, num_chunks: int, maxlen: int) -> None:
    pipe.xadd(keys.events, {"node": node_id, "kind": "resync", "tier": "", "count": num_chunks, "keys": b""},
              maxlen=maxlen, approximate=True)


def decode_entry(entry_id: bytes | str, fields: dict[bytes, bytes]) -> list[ClusterEvent]:
    """The events of one stream entry, one per key."""
    entry = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    node = fields[b"node"].decode()
    kind = fields[b"kind"].decode()
    tier_name = fields.get(b"tier", b"").decode()
    if kind == "resync" or not tier_name:
        return [ClusterEvent(entry, node, kind, None, None)]
    tier = TierKind.parse(tier_name)
    blob = fields.get(b"keys", b"")
    return [ClusterEvent(entry, node, kind, tier, blob[i:i + KEY_BYTES]) for i in range(0, len(blob), KEY_BYTES)]


class EventSubscriber:
    """Reads the stream from `last_id` on ("$" = only new entries; "0" = everything still kept).

    Args:
        client: a redis-py client (decode_responses=False).
        cluster_name: the cluster's name (ClusterConfig.cluster_name).
        last_id: where to start; advanced as entries are read.
    """

    def __init__(self, client: Any, cluster_name: str, last_id: str = "$") -> None:
        self.client = client
        self.keys = ClusterKeys(cluster_name)
        self.last_id = last_id

    def read(self, *, block_ms: int | None = 1000, count: int = 100) -> list[ClusterEvent]:
        """The next entries' events; waits up to `block_ms` for one (None: do not wait)."""
        if self.last_id == "$":  # pin "$" to the current end, so consecutive reads miss nothing
            info = self.client.xinfo_stream(self.keys.events) if self.client.exists(self.keys.events) else None
            self.last_id = info["last-generated-id"].decode() if info else "0"
        reply = self.client.xread({self.keys.events: self.last_id}, count=count, block=block_ms)
        events: list[ClusterEvent] = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                events.extend(decode_entry(entry_id, fields))
                self.last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        return events

    def __iter__(self) -> Iterator[ClusterEvent]:
        while True:
            yield from self.read()


def summarize(events: Sequence[ClusterEvent]) -> dict[str, int]:
    """Counts per "node/kind/tier", e.g. for a log line or a test."""
    counts: dict[str, int] = {}
    for event in events:
        name = f"{event.node_id}/{event.kind}/{event.tier.value if event.tier else '-'}"
        counts[name] = counts.get(name, 0) + 1
    return counts
