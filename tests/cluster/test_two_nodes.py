"""Two stores sharing one PFS directory and one Redis behave as two nodes of one cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.cluster import NodeInfo
from kvstore.cluster.events import EventSubscriber, summarize
from kvstore.types import TierKind
from tests.cluster.factories import chunk_of, empty_chunk, join, node_store, prompt

pytestmark = pytest.mark.redis


@pytest.fixture
def two_nodes(tmp_path: Path, redis_url: str) -> Iterator[Any]:
    stores = [node_store(tmp_path, name, shared_pfs=tmp_path / "pfs") for name in ("a", "b")]
    nodes = [join(store, redis_url, name) for store, name in zip(stores, ("node-a", "node-b"), strict=True)]
    yield stores, nodes
    for node, store in zip(nodes, stores, strict=True):
        node.close()
        store.close()


def test_a_chunk_put_on_a_is_a_hit_on_b_read_from_the_pfs(two_nodes: Any) -> None:
    (store_a, store_b), (node_a, node_b) = two_nodes
    tokens = prompt(4, seed=1)
    keys, chunks = store_a.chunk_keys(tokens), [chunk_of(i) for i in range(4)]
    assert store_a.put_many(keys, chunks).ok
    store_a.flush()
    assert store_b.lookup(tokens) == 4 * 16
    outs = [empty_chunk() for _ in keys]
    assert store_b.get_many(keys, outs) == [True] * 4
    assert all(torch.equal(out, chunk) for out, chunk in zip(outs, chunks, strict=True))
    assert store_b.stats()["tiers"]["pfs"]["hits"] == 4  # B never had them locally: they came from the PFS
    node_a.index.flush()
    node_b.index.flush()
    # the cluster index names both nodes: A in every tier it wrote, B in its host tier (promoted on read)
    for where in node_b.index.holders(keys):
        assert set(where["node-a"]) == {TierKind.HOST, TierKind.NVME, TierKind.PFS}
        assert TierKind.HOST in where["node-b"]
    assert {n.node_id for n in node_a.index.live_nodes()} == {"node-a", "node-b"}


def test_route_prefers_the_longest_prefix_then_the_lower_load(two_nodes: Any) -> None:
    (store_a, store_b), (node_a, node_b) = two_nodes
    shared, only_a = prompt(3, seed=2), prompt(5, seed=3)
    store_a.put_many(store_a.chunk_keys(only_a), [chunk_of(i) for i in range(5)])
    store_b.put_many(store_b.chunk_keys(shared), [chunk_of(10 + i) for i in range(3)])
    store_a.put_many(store_a.chunk_keys(shared)[:2], [chunk_of(10 + i) for i in range(2)])
    node_a.set_load(1.0)
    node_b.set_load(7.0)
    for node in (node_a, node_b):
        node.index.flush()
        node.index.heartbeat()
    assert node_b.route(only_a).node_id == "node-a"
    decision = node_a.route(shared)  # B holds 3 leading chunks, A only 2 (the PFS copy is A's and B's alike)
    assert decision.prefix_by_node["node-b"] >= decision.prefix_by_node["node-a"]
    unknown = prompt(2, seed=4)
    assert node_a.route(unknown).node_id == "node-a"  # nobody has it: the less loaded node
    assert node_a.route(unknown, [NodeInfo("node-b", 0.0), NodeInfo("node-c", 3.0)]).node_id == "node-b"


def test_event_stream_carries_stored_and_evicted_per_node_and_tier(two_nodes: Any, redis_url: str) -> None:
    (store_a, _), (node_a, node_b) = two_nodes
    node_a.index.flush()
    subscriber = node_b.subscribe(last_id="$")
    subscriber.read(block_ms=None)  # pin the start
    keys = store_a.chunk_keys(prompt(2, seed=5))
    store_a.put_many(keys, [chunk_of(0), chunk_of(1)])
    store_a.flush()
    store_a.remove(keys[0])
    node_a.index.flush()
    events = []  # type: ignore[var-annotated]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(events) < 8:
        events += subscriber.read(block_ms=200)
    counts = summarize(events)
    assert counts["node-a/stored/host"] == 2 and counts["node-a/stored/pfs"] == 2
    assert counts["node-a/evicted/host"] == 1 and counts["node-a/evicted/pfs"] == 1
    assert {e.key for e in events if e.kind == "evicted"} == {keys[0]}
    assert EventSubscriber(node_a.client, "test", last_id="0").read(block_ms=None)  # history is kept (MAXLEN ~)


def test_a_dead_nodes_entries_expire(tmp_path: Path, redis_url: str) -> None:
    store = node_store(tmp_path, "c")
    node = join(store, redis_url, "node-c", entry_ttl_s=1.0, heartbeat_s=0.2)
    observer = join(node_store(tmp_path, "d"), redis_url, "node-d")
    keys = store.chunk_keys(prompt(2, seed=6))
    store.put_many(keys, [chunk_of(0), chunk_of(1)])
    node.index.flush()
    assert "node-c" in observer.index.holders(keys)[0]
    node.close()  # stops heartbeats, as a crash would
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and observer.index.node_chunks("node-c"):
        time.sleep(0.1)
    assert observer.index.node_chunks("node-c") == {}
    assert observer.index.holders(keys, ["node-c"]) == [{}, {}]
    assert "node-c" not in {n.node_id for n in observer.index.live_nodes()}
    observer.close()
    observer.store.close()
    store.close()
