"""`kvstore pd-proxy --kv-events`: the proxy follows two nodes' daemons' KV events (no Redis) and sends a prompt
whose prefix one node holds to that node's prefill and decode instances, even where load alone would choose the
other; once that node loses the chunks (a delete), the prompt is placed by load again. A daemon restarted under
the proxy is followed again from its new sequence."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from connector.client import KVStoreClient
from kvstore.errors import ConfigError
from service.pd_proxy.config import EventSource, InstanceSpec, ProxyConfig
from service.process import Daemon, free_port, write_config
from tests.conftest import make_chunk
from tests.helpers.pd_servers import ProxyServer, Standin
from tests.helpers.waits import wait_until
from tests.service.conftest import LAYOUT


def _node(root: Path, name: str) -> tuple[Daemon, EventSource]:
    source = EventSource(name, f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    events = {"enabled": True, "endpoint": source.endpoint, "replay_endpoint": source.replay_endpoint}
    (root / name).mkdir()
    config = write_config(root / name, layout=LAYOUT, host_chunks=16, nvme_chunks=0, service={"kv_events": events})
    return Daemon(config, root / name / "daemon.log").start(), source


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[dict[str, Any]]:
    (a, source_a), (b, source_b) = _node(tmp_path, "node-a"), _node(tmp_path, "node-b")
    servers = {n: Standin(n, tmp_path, wait=False) for n in ("pb", "pa", "db", "da")}
    try:
        for server in servers.values():
            server.wait_up()
        yield {"a": a, "b": b, "sources": (source_a, source_b), "servers": servers}
    finally:
        for server in servers.values():
            server.kill()
        a.close()
        b.close()


def _complete(proxy: ProxyServer, prompt: list[int]) -> None:
    answer = httpx.post(f"{proxy.url}/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=30.0)
    assert answer.status_code == 200, answer.text


def _served(servers: dict[str, Standin], first_token: int) -> set[str]:
    return {n for n, s in servers.items() if any(r["body"]["prompt"][0] == first_token for r in s.received())}


def test_the_node_whose_events_hold_the_prefix_gets_the_request(nodes: dict[str, Any]) -> None:
    servers, cached = nodes["servers"], list(range(3, 3 + 3 * LAYOUT.chunk_tokens + 5))
    prefill = [InstanceSpec(servers["pb"].url, "node-b"), InstanceSpec(servers["pa"].url, "node-a")]
    decode = [InstanceSpec(servers["db"].url, "node-b"), InstanceSpec(servers["da"].url, "node-a")]
    with ProxyServer(prefill, decode, kvstore_url=nodes["a"].url, kv_events=nodes["sources"]) as proxy:
        index = proxy.state.events
        assert index is not None
        with KVStoreClient(nodes["a"].url, use_shm=False) as client:
            keys = client.chunk_keys(cached)
            assert client.put_many(keys, [make_chunk(LAYOUT, i) for i in range(len(keys))]).ok
        assert wait_until(lambda: index.prefix_chunks(keys, ["node-a", "node-b"]) == {"node-a": 3, "node-b": 0}, 30)
        _complete(proxy, cached)  # load alone: pb and db (listed first)
        assert _served(servers, 3) == {"pa", "da"}

        with nodes["a"].client() as http:  # node-a loses the first chunk: no prefix left there
            assert http.delete(f"/v1/chunks/{keys[0].hex()}").json() == {"removed": True}
        assert wait_until(lambda: index.prefix_chunks(keys, ["node-a"]) == {"node-a": 0}, 30)
        again = [3, *cached[1:]]
        _complete(proxy, again)
        assert len([r for r in servers["pb"].received() if r["body"]["prompt"][0] == 3]) == 1  # placed by load
        assert proxy.state.metrics.total("route_calls", outcome="events") == 2

        assert nodes["a"].stop() == 0  # a restart: the proxy's view follows the new daemon's sequence from 0
        nodes["a"].start()
        with KVStoreClient(nodes["a"].url, use_shm=False) as client:
            assert client.put_many(keys[:1], [make_chunk(LAYOUT, 0)]).ok
        assert wait_until(lambda: index.prefix_chunks(keys, ["node-a"]) == {"node-a": 1}, 30)


def test_kv_events_need_a_namespace_and_well_formed_sources() -> None:
    source = EventSource.parse("node-a=tcp://127.0.0.1:5557,tcp://127.0.0.1:5558")
    assert (source.node_id, source.replay_endpoint) == ("node-a", "tcp://127.0.0.1:5558")
    with pytest.raises(ConfigError, match="REPLAY_PORT"):
        EventSource.parse("node-a=tcp://127.0.0.1:5557")
    with pytest.raises(ConfigError, match="--kvstore-url"):
        ProxyConfig(prefill=(), decode=(InstanceSpec("http://127.0.0.1:1"),), kv_events=(source,))
