"""End to end against a real `kvstore serve`: put/get/lookup over HTTP and over shared memory,
raw single-chunk routes, stats and metrics, and a clean SIGTERM shutdown that keeps every chunk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch

from connector.client import KVStoreClient
from service.process import Daemon
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, start_daemon


def _prompt(seed: int, num_chunks: int) -> list[int]:
    return list(range(seed * 100_000, seed * 100_000 + num_chunks * LAYOUT.chunk_tokens + 3))


def _empty() -> torch.Tensor:
    return torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)


@pytest.mark.parametrize("use_shm", [False, True], ids=["http", "shm"])
def test_put_get_lookup(daemon: Any, use_shm: Any) -> None:
    with KVStoreClient(daemon.url, use_shm=use_shm) as client:
        assert client.use_shm is use_shm
        tokens = _prompt(1 + use_shm, 4)
        keys = client.chunk_keys(tokens)
        chunks = [make_chunk(LAYOUT, 10 * use_shm + i) for i in range(4)]
        assert client.lookup(tokens) == 0
        result = client.put_many(keys[:3], chunks[:3])
        assert result.ok and result.stored == keys[:3] and not result.not_replicated  # acknowledged = on disk
        assert client.lookup(tokens) == 3 * LAYOUT.chunk_tokens
        outs = [_empty() for _ in keys]
        assert client.get_many(keys, outs) == [True, True, True, False]
        assert all(torch.equal(a, b) for a, b in zip(chunks[:3], outs[:3], strict=True))
        assert client.remove(keys[1]) and not client.contains(keys[1])
        assert client.lookup(tokens) == LAYOUT.chunk_tokens


def test_shm_and_http_clients_see_the_same_chunks(daemon: Any) -> None:
    with KVStoreClient(daemon.url, use_shm=True) as shm, KVStoreClient(daemon.url, use_shm=False) as http:
        keys = shm.chunk_keys(_prompt(7, 2))
        assert keys == http.chunk_keys(_prompt(7, 2))
        chunks = [make_chunk(LAYOUT, 70 + i) for i in range(2)]
        assert http.put_many(keys, chunks).ok
        outs = [_empty(), _empty()]
        assert shm.get_many(keys, outs) == [True, True]
        assert torch.equal(outs[1], chunks[1])


def test_raw_chunk_routes_and_server_side_lookup(daemon: Any) -> None:
    chunk = make_chunk(LAYOUT, 5)
    raw = chunk.view(torch.uint8).numpy().tobytes()
    with KVStoreClient(daemon.url) as client, daemon.client() as http:
        tokens = _prompt(9, 1)
        key = client.chunk_keys(tokens)[0]
        answer = http.put(f"/v1/chunks/{key.hex()}", content=raw,
                          headers={"X-KV-Layout": client.info.layout_fingerprint})
        assert answer.status_code == 200 and answer.json()["durable"] is True
        got = http.get(f"/v1/chunks/{key.hex()}")
        assert got.status_code == 200 and got.content == raw
        found = http.post("/v1/lookup", json={"token_ids": tokens}).json()
        assert found == {"num_tokens": LAYOUT.chunk_tokens, "num_chunks": 1, "keys": [key.hex()]}
        packed = http.post("/v1/lookup", content=msgpack.packb({"keys": [key]}),
                           headers={"Content-Type": "application/msgpack", "Accept": "application/msgpack"})
        assert msgpack.unpackb(packed.content)["keys"] == [key]
        assert http.delete(f"/v1/chunks/{key.hex()}").json() == {"removed": True}
        assert http.get(f"/v1/chunks/{key.hex()}").status_code == 404


def test_json_and_msgpack_answers_keep_their_shapes(daemon: Daemon) -> None:
    """The typed messages (kvstore/wire_types.py) keep the HTTP API's JSON shapes for external users:
    the same fields, keys and bytes as hex in JSON, raw in msgpack."""
    chunk = make_chunk(LAYOUT, 6).view(torch.uint8).numpy().tobytes()
    with daemon.client() as http:
        info = http.get("/v1/info").json()
        assert set(info) == {"tenant", "model_id", "layout", "layout_fingerprint", "chunk_bytes", "root_key",
                             "instance", "shm_plane", "lease_s", "max_batch_chunks", "max_body_bytes", "any_layout"}
        assert len(info["root_key"]) == 32 and info["shm_plane"] == "segments"
        key = "5a" * 16
        put = http.post("/v1/chunks/put", json={"keys": [key], "data": chunk.hex(), "layout": info["layout_fingerprint"]})
        assert put.json() == {"stored": [key], "not_stored": {}, "not_replicated": {}, "durable": True}
        looked = http.post("/v1/lookup", json={"keys": [key, "00" * 16]}).json()
        assert looked == {"num_tokens": LAYOUT.chunk_tokens, "num_chunks": 1, "keys": [key]}
        got = http.post("/v1/chunks/get", json={"keys": [key]}).json()
        assert got == {"found": [True], "data": chunk.hex()}
        packed = http.post("/v1/lookup", content=msgpack.packb({"keys": [bytes.fromhex(key)]}),
                           headers={"Content-Type": "application/msgpack", "Accept": "application/msgpack"})
        assert msgpack.unpackb(packed.content)["keys"] == [bytes.fromhex(key)]
        assert http.post("/v1/chunks/delete", json={"keys": [key]}).json() == {"removed": [True]}
        assert http.get("/healthz").json() == {"status": "ready"}


def test_stats_and_metrics(daemon: Any) -> None:
    with KVStoreClient(daemon.url, use_shm=False) as client:
        key = client.chunk_keys(_prompt(11, 1))[0]
        client.put(key, make_chunk(LAYOUT, 11))
        assert client.get(key, _empty())
        stats = client.stats()
        assert stats["get_hits"] >= 1 and stats["tiers"]["nvme"]["puts"] >= 1
    assert daemon.metric("kvstore_tier_hits_total", tier="host") >= 1
    assert daemon.metric("kvstore_http_request_duration_seconds_count", route="/v1/chunks/get", method="POST") >= 1
    assert daemon.metric("kvstore_shm_segments") >= 0


def test_sigterm_drains_and_restart_recovers_over_a_unix_socket(tmp_path: Path) -> None:
    """Puts acknowledged before their disk copy (durable_puts off) survive SIGTERM: the daemon drains its
    write queues and exits 0. The same client keeps working across the restart (new shm segment)."""
    d = start_daemon(tmp_path, uds=tmp_path / "kv.sock", service={"durable_puts": False})
    try:
        with KVStoreClient(d.url) as client:
            assert client.use_shm
            keys = client.chunk_keys(_prompt(3, 12))
            chunks = [make_chunk(LAYOUT, 300 + i) for i in range(12)]
            assert client.put_many(keys, chunks).ok
            assert d.stop() == 0
            assert client.lookup_keys(keys) == 0  # daemon down: a miss, not an exception
            d.start()
            outs = [_empty() for _ in keys]
            assert client.get_many(keys, outs) == [True] * 12
            assert all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))
    finally:
        d.close()
