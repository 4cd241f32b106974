"""`kvstore pd-proxy --kvstore-url`: a prompt whose prefix a cluster node holds goes to the prefill instance
on that node, and its decode to the decode instance on the same node, even where load alone would choose
another; a prompt nobody holds is placed by load. A real daemon in a Redis cluster answers the route."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from connector.client import KVStoreClient
from kvstore.layout import KVLayout
from service.pd_proxy.config import InstanceSpec
from service.process import Daemon, write_config
from tests.conftest import make_chunk
from tests.helpers.pd_servers import ProxyServer, Standin

pytestmark = pytest.mark.redis
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, dtype="float16", chunk_tokens=16)


@pytest.fixture
def node_a(tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    monkeypatch.setenv("KVSTORE_CLUSTER_URL", redis_url)
    monkeypatch.setenv("KVSTORE_CLUSTER_NODE_ID", "node-a")
    (tmp_path / "a").mkdir()
    daemon = Daemon(write_config(tmp_path / "a", layout=LAYOUT, nvme_chunks=0), tmp_path / "a" / "daemon.log").start()
    yield daemon
    daemon.close()


def _store_prefix(daemon: Daemon, tokens: list[int]) -> None:
    """Put the prompt's whole chunks on node-a and wait until the cluster index says so."""
    with KVStoreClient(daemon.url, use_shm=False) as client:
        keys = client.chunk_keys(tokens)
        assert client.put_many(keys, [make_chunk(LAYOUT, i) for i in range(len(keys))]).ok
        deadline = time.monotonic() + 30
        while not client.route(tokens, ["node-a"]).cached_tokens_by_node.get("node-a") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.route(tokens, ["node-a"]).cached_tokens_by_node.get("node-a")


def test_the_node_holding_the_prefix_gets_the_prefill_and_the_decode(tmp_path: Path, node_a: Daemon) -> None:
    cached = list(range(3, 3 + 3 * LAYOUT.chunk_tokens + 5))
    _store_prefix(node_a, cached)
    names = ("pb", "pa", "db", "da")
    servers = {n: Standin(n, tmp_path, wait=False) for n in names}
    try:
        for server in servers.values():
            server.wait_up()
        prefill = [InstanceSpec(servers["pb"].url, "node-b"), InstanceSpec(servers["pa"].url, "node-a")]
        decode = [InstanceSpec(servers["db"].url, "node-b"), InstanceSpec(servers["da"].url, "node-a")]
        with ProxyServer(prefill, decode, kvstore_url=node_a.url) as proxy:  # load alone: pb and db (listed first)
            for prompt in (cached, list(range(500, 560))):
                answer = httpx.post(f"{proxy.url}/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=30.0)
                assert answer.status_code == 200, answer.text
            assert proxy.state.metrics.total("route_calls", outcome="ok") == 2
        got = {n: [r["body"]["prompt"][0] for r in servers[n].received()] for n in names}
        assert got == {"pa": [3], "da": [3], "pb": [500], "db": [500]}
    finally:
        for server in servers.values():
            server.kill()
