"""Tenants: tokens, isolation of key spaces (no reading, probing or deleting another tenant's chunks),
shared-memory rights and byte quotas that evict only the tenant's own chunks."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import torch

from connector.client import KVStoreClient, RemoteError
from kvstore.hashing import Namespace
from service.config import TenantConfig
from service.errors import QuotaError
from service.tenants import Tenant
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, TOKENS


def _empty() -> torch.Tensor:
    return torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)


def test_bad_or_missing_token_is_401(tenant_daemon: Any) -> None:
    for headers in ({}, {"Authorization": "Bearer nope-nope-nope"}, {"Authorization": "Basic YTpi"}):
        reply = httpx.get(f"{tenant_daemon.url}/v1/info", headers=headers)
        assert reply.status_code == 401 and "token" in reply.json()["detail"]
    with pytest.raises(RemoteError, match="401"):
        KVStoreClient(tenant_daemon.url, token="wrong-token-123")


def test_one_tenant_cannot_read_probe_or_delete_anothers_chunks(tenant_daemon: Any) -> None:
    with KVStoreClient(tenant_daemon.url, token=TOKENS["a"]) as a, \
            KVStoreClient(tenant_daemon.url, token=TOKENS["b"]) as b:
        tokens = list(range(3 * LAYOUT.chunk_tokens))
        assert a.chunk_keys(tokens) != b.chunk_keys(tokens)  # the salt is part of the namespace
        keys_a = a.chunk_keys(tokens)
        chunks = [make_chunk(LAYOUT, i) for i in range(3)]
        assert a.put_many(keys_a, chunks).ok and a.lookup(tokens) == 3 * LAYOUT.chunk_tokens
        # b, even holding a's exact keys, sees nothing: its keys map elsewhere on the server.
        assert b.lookup(tokens) == 0 and b.lookup_keys(keys_a) == 0
        assert b.get_many(keys_a, [_empty() for _ in keys_a]) == [False] * 3
        with tenant_daemon.client(TOKENS["b"]) as http:
            assert http.get(f"/v1/chunks/{keys_a[0].hex()}").status_code == 404
            assert http.delete(f"/v1/chunks/{keys_a[0].hex()}").json() == {"removed": False}
        out = _empty()
        assert a.get(keys_a[0], out) and torch.equal(out, chunks[0])


def test_shm_plane_is_per_tenant_right(tenant_daemon: Any) -> None:
    with KVStoreClient(tenant_daemon.url, token=TOKENS["a"]) as a:
        assert a.use_shm
    with KVStoreClient(tenant_daemon.url, token=TOKENS["b"]) as b:
        assert not b.use_shm and b.info.shm_plane is None
        reply = tenant_daemon.client(TOKENS["b"]).post("/v1/shm/segments", json={"slots": 1})
        assert reply.status_code == 403 and "shm = true" in reply.json()["detail"]


def test_quota_evicts_only_the_tenants_own_chunks(tenant_daemon: Any) -> None:
    with KVStoreClient(tenant_daemon.url, token=TOKENS["q"]) as q, \
            KVStoreClient(tenant_daemon.url, token=TOKENS["b"]) as b:
        other = b.chunk_keys(list(range(500, 500 + 2 * LAYOUT.chunk_tokens)))
        assert b.put_many(other, [make_chunk(LAYOUT, 50), make_chunk(LAYOUT, 51)]).ok
        keys = q.chunk_keys(list(range(10_000, 10_000 + 8 * LAYOUT.chunk_tokens)))
        for i, key in enumerate(keys):  # quota: 4 chunks
            assert q.put(key, make_chunk(LAYOUT, 100 + i)).ok
        assert q.stats()["tenant"]["used_bytes"] == 4 * LAYOUT.chunk_bytes
        assert [q.contains(k) for k in keys] == [False] * 4 + [True] * 4  # its oldest went first
        assert b.lookup_keys(other) == 2  # nobody else lost anything
        more = q.chunk_keys(list(range(20_000, 20_000 + 5 * LAYOUT.chunk_tokens)))
        result = q.put_many(more, [make_chunk(LAYOUT, 200 + i) for i in range(5)])  # 5 new > quota of 4
        assert not result.stored and "quota" in next(iter(result.not_stored.values()))


def test_tenant_quota_ledger_and_key_map() -> None:
    ns = Namespace(model_id="m", layout_fingerprint=1)
    t = Tenant.from_config(TenantConfig(name="t", token="tok-12345678", salt="s", quota_bytes={"host": 300}), ns)
    assert t.map_key(b"k" * 16) != b"k" * 16 and t.root_key != ns.root_key
    assert Tenant.anonymous(ns.root_key).map_key(b"k" * 16) == b"k" * 16
    keys = [bytes([i]) * 16 for i in range(4)]
    assert t.charge(keys[:3], 100) == [] and t.used_bytes == 300  # charged before anything is stored
    t.touch([keys[0]])  # keys[1] is now least recently used
    assert t.charge([keys[3]], 100) == [keys[1]]
    with pytest.raises(QuotaError, match="quota of 300"):
        t.charge([bytes([9 + i]) * 16 for i in range(4)], 100)
    held = {keys[0], keys[3]}  # what the store's index holds: the ledger follows it
    t.settle(keys, 100, held.__contains__)
    assert t.used_bytes == 200 and t.num_chunks == 2 and set(t.keys()) == held
