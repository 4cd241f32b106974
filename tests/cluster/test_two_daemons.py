"""Two real `kvstore serve` processes sharing one PFS directory and one Redis behave as two nodes:
a chunk put through A is a lookup hit on B, read from the PFS byte-identical, and B routes the
prompt to A through the cluster index."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from connector.client import KVStoreClient
from kvstore.layout import KVLayout
from service.process import Daemon
from tests.conftest import make_chunk

pytestmark = pytest.mark.redis
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, dtype="float16", chunk_tokens=16)


def _config(root: Path, pfs: Path) -> Path:
    lines = ['model_id = "two-nodes"', "[layout]"]
    lines += [f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}" for k, v in LAYOUT.to_dict().items()]
    lines += ["[[tiers]]", 'kind = "host"', f"capacity = '{8 * LAYOUT.chunk_bytes}B'",
              "[[tiers]]", 'kind = "pfs"', f"capacity = '{256 * (LAYOUT.chunk_bytes + 8192)}B'", f'path = "{pfs}"']
    root.mkdir(parents=True, exist_ok=True)
    path = root / "kvstore.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _node(tmp_path: Path, name: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    monkeypatch.setenv("KVSTORE_CLUSTER_URL", redis_url)
    monkeypatch.setenv("KVSTORE_CLUSTER_NODE_ID", f"node-{name}")
    root = tmp_path / name
    return Daemon(_config(root, tmp_path / "pfs"), root / "daemon.log").start()


def test_chunk_put_on_a_is_a_hit_on_b_and_routes_to_a(tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    a = _node(tmp_path, "a", redis_url, monkeypatch)
    b = _node(tmp_path, "b", redis_url, monkeypatch)
    try:
        with KVStoreClient(a.url, use_shm=False) as client_a, KVStoreClient(b.url, use_shm=False) as client_b:
            tokens = list(range(3 * LAYOUT.chunk_tokens + 5))
            keys = client_a.chunk_keys(tokens)
            assert keys == client_b.chunk_keys(tokens)  # same model, same namespace
            chunks = [make_chunk(LAYOUT, i) for i in range(3)]
            assert client_a.put_many(keys, chunks).ok  # acknowledged once on the PFS (durable puts)
            assert client_b.lookup(tokens) == 3 * LAYOUT.chunk_tokens
            outs = [torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype) for _ in keys]
            assert client_b.get_many(keys, outs) == [True] * 3
            assert all(torch.equal(x, y) for x, y in zip(chunks, outs, strict=True))
            # The cluster index is published in batches: poll until A's batch is in Redis.
            deadline = time.monotonic() + 20
            while True:
                decision = client_b.route(tokens)
                if decision.cached_tokens_by_node.get("node-a") or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert decision.cached_tokens_by_node["node-a"] == 3 * LAYOUT.chunk_tokens
            with b.client() as http:
                health = http.get("/healthz").json()
            assert health["cluster"]["redis"] in ("ok", "degraded")
        assert a.stop() == 0 and b.stop() == 0
    finally:
        a.close()
        b.close()
