"""The daemon's cluster routes (service/cluster.py) on two apps sharing one PFS directory and one Redis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch
from fastapi.testclient import TestClient

from kvstore.store import TieredStore
from service.app import create_app
from service.cluster import attach_cluster, cluster_config_from_env, detach_cluster
from service.config import ServiceConfig
from tests.cluster.factories import chunk_of, cluster_config, node_store, prompt

pytestmark = pytest.mark.redis


def _app(tmp_path: Path, name: Any, redis_url: str) -> Any:
    store = node_store(tmp_path, name, shared_pfs=tmp_path / "pfs")
    store.close()  # only its config is wanted: the app opens its own store at startup
    holder = {}  # type: ignore[var-annotated]

    def open_store(config: Any) -> Any:  # what the lead's lifespan does: open the store, then attach the cluster
        opened = TieredStore(config)
        attach_cluster(holder["app"], opened, cluster_config(redis_url, f"node-{name}"))
        return opened

    holder["app"] = create_app(store.config, ServiceConfig(shm=False), store_factory=open_store)
    return holder["app"]


def test_route_events_health_through_http(tmp_path: Path, redis_url: str) -> None:
    app_a, app_b = _app(tmp_path, "a", redis_url), _app(tmp_path, "b", redis_url)
    with TestClient(app_a) as http_a, TestClient(app_b) as http_b:
        store_a = app_a.state.cluster.store
        tokens = prompt(3, seed=11)
        keys = store_a.chunk_keys(tokens)
        for i, key in enumerate(keys):
            chunk = chunk_of(i).reshape(-1).view(torch.uint8).numpy().tobytes()
            assert http_a.put(f"/v1/chunks/{key.hex()}", content=chunk,
                              headers={"content-type": "application/octet-stream"}).status_code == 200
        store_a.flush()
        assert http_b.post("/v1/lookup", json={"token_ids": tokens.tolist()}).json()["num_tokens"] == 48  # via PFS
        app_a.state.cluster.index.flush()
        app_b.state.cluster.index.flush()

        decision = http_b.post("/v1/route", json={"token_ids": tokens.tolist()}).json()
        assert decision["node_id"] == "node-a" and decision["cached_tokens"] == 48
        assert decision["cached_tokens_by_node"] == {"node-a": 48, "node-b": 0}
        assert http_b.post("/v1/route", json={"token_ids": tokens.tolist(), "nodes": ["node-b"]}).json()["node_id"] == "node-b"
        assert http_b.post("/v1/route", json={"nodes": ["x"]}).status_code == 400
        packed = msgpack.packb({"keys": keys[:2]}, use_bin_type=True)  # what connector/client.py would send
        answer = http_b.post("/v1/route", content=packed, headers={"content-type": "application/msgpack",
                                                                    "accept": "application/msgpack"})
        assert msgpack.unpackb(answer.content)["node_id"] == "node-a"

        assert {n["node_id"] for n in http_a.get("/v1/cluster/nodes").json()["nodes"]} == {"node-a", "node-b"}
        page = http_b.get("/v1/cluster/events", params={"last_id": "0", "count": 1000}).json()
        stored = {(e["node_id"], e["tier"], e["key"]) for e in page["events"] if e["kind"] == "stored"}
        assert {("node-a", "host", k.hex()) for k in keys} <= stored
        assert http_a.get("/v1/cluster/health").json()["redis"] == "ok"
    detach_cluster(app_a)
    detach_cluster(app_b)


def test_without_a_cluster_the_routes_answer_503(tmp_path: Path) -> None:
    store = node_store(tmp_path, "solo")
    store.close()
    holder = {}  # type: ignore[var-annotated]

    def open_store(config: Any) -> Any:
        opened = TieredStore(config)
        attach_cluster(holder["app"], opened, None)
        return opened

    holder["app"] = create_app(store.config, ServiceConfig(shm=False), store_factory=open_store)
    with TestClient(holder["app"]) as http:
        response = http.post("/v1/route", json={"token_ids": [1, 2, 3]})
        assert response.status_code == 503 and "KVSTORE_CLUSTER_URL" in response.json()["detail"]
        assert http.post("/v1/lookup", json={"token_ids": [1, 2, 3]}).status_code == 200  # data routes unaffected


def test_cluster_config_from_env() -> None:
    assert cluster_config_from_env({}) is None
    config = cluster_config_from_env({"KVSTORE_CLUSTER_URL": "redis://r:6379/0", "KVSTORE_CLUSTER_NODE_ID": "n1",
                                      "KVSTORE_CLUSTER_NAME": "prod", "KVSTORE_CLUSTER_PFS_BUDGET": "2GiB"})
    assert (config.url, config.node_id, config.cluster_name) == ("redis://r:6379/0", "n1", "prod")  # type: ignore[union-attr]
    assert config.pfs_budget_bytes == 2 << 30  # type: ignore[union-attr]
