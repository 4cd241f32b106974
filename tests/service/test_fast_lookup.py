"""POST /v1/lookup's fast path (service/fast_lookup.py) against a real daemon: it answers msgpack
lookups of known tenants exactly as the route does, and hands everything else to the route."""

from __future__ import annotations

from typing import Any

import msgpack
import torch

from connector.client import KVStoreClient
from tests.service.conftest import LAYOUT, TOKENS

MSGPACK = "application/msgpack"


def _fast_count(http: Any, token: str) -> int:
    stats = http.get("/v1/stats", headers={"Authorization": f"Bearer {token}"}).json()
    return int(stats["service"]["fast_lookups"])


def test_fast_path_answers_like_the_route(tenant_daemon: Any) -> None:
    tokens = list(range(7000, 7000 + 3 * LAYOUT.chunk_tokens + 5))  # not a prefix another test of tenant a stores
    with KVStoreClient(tenant_daemon.url, token=TOKENS["a"]) as client:
        keys = client.chunk_keys(tokens)
        chunk = torch.ones(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
        assert client.put_many(keys[:2], [chunk, chunk]).ok
    auth = {"Authorization": f"Bearer {TOKENS['a']}"}
    with tenant_daemon.client() as http:
        before = _fast_count(http, TOKENS["a"])
        fast = http.post("/v1/lookup", content=msgpack.packb({"token_ids": tokens}),
                         headers={**auth, "Content-Type": MSGPACK, "Accept": MSGPACK})
        assert fast.status_code == 200 and fast.headers["content-type"] == MSGPACK
        assert _fast_count(http, TOKENS["a"]) == before + 1
        route = http.post("/v1/lookup", json={"token_ids": tokens}, headers=auth)  # JSON: the route answers
        assert _fast_count(http, TOKENS["a"]) == before + 1
    fast_body, route_body = msgpack.unpackb(fast.content), route.json()
    assert fast_body["num_chunks"] == route_body["num_chunks"] == 2
    assert fast_body["num_tokens"] == route_body["num_tokens"] == 2 * LAYOUT.chunk_tokens
    assert [k.hex() for k in fast_body["keys"]] == route_body["keys"] == [k.hex() for k in keys[:2]]


def test_other_tenants_token_sees_nothing_through_the_fast_path(tenant_daemon: Any) -> None:
    tokens = list(range(1000, 1000 + 2 * LAYOUT.chunk_tokens))
    with KVStoreClient(tenant_daemon.url, token=TOKENS["a"]) as a, KVStoreClient(tenant_daemon.url, token=TOKENS["b"]) as b:
        assert a.put_many(a.chunk_keys(tokens), [torch.zeros(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)] * 2).ok
        assert a.lookup(tokens) == 2 * LAYOUT.chunk_tokens
        assert b.lookup(tokens) == 0


def test_errors_go_to_the_route(tenant_daemon: Any) -> None:
    msgpack_headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
    body = msgpack.packb({"token_ids": [1, 2, 3]})
    with tenant_daemon.client() as http:
        before = _fast_count(http, TOKENS["b"])
        missing = http.post("/v1/lookup", content=body, headers=msgpack_headers)
        assert missing.status_code == 401 and "missing bearer token" in missing.json()["detail"]
        unknown = http.post("/v1/lookup", content=body, headers={**msgpack_headers, "Authorization": "Bearer nope"})
        assert unknown.status_code == 401 and "unknown bearer token" in unknown.json()["detail"]
        auth = {**msgpack_headers, "Authorization": f"Bearer {TOKENS['b']}"}
        bad = http.post("/v1/lookup", content=b"\xc1not msgpack", headers=auth)
        assert bad.status_code == 400 and "not valid msgpack" in bad.json()["detail"]
        neither = http.post("/v1/lookup", content=msgpack.packb({"prompt": "hi"}), headers=auth)
        assert neither.status_code == 400 and "needs 'token_ids'" in neither.json()["detail"]
        negative = http.post("/v1/lookup", content=msgpack.packb({"token_ids": [1, -2]}), headers=auth)
        assert negative.status_code == 400
        assert _fast_count(http, TOKENS["b"]) == before  # none of them was answered by the fast path
        assert http.get("/healthz").status_code == 200


def test_a_body_over_the_fast_limit_is_replayed_to_the_route(daemon: Any) -> None:
    """A 2.6 MB lookup (600k token ids) arrives in many ASGI messages; the fast path stops reading at
    1 MiB and the route gets the whole body back, in order."""
    tokens = [70_000 + (i % 50_000) for i in range(600_000)]
    with KVStoreClient(daemon.url) as client:
        keys = client.chunk_keys(tokens)
        assert client.put_many(keys[:3], [torch.ones(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)] * 3).ok
    body = msgpack.packb({"token_ids": tokens})
    assert len(body) > 2 << 20
    with daemon.client() as http:
        before = int(http.get("/v1/stats").json()["service"]["fast_lookups"])
        answer = http.post("/v1/lookup", content=body, headers={"Content-Type": MSGPACK, "Accept": MSGPACK})
        assert answer.status_code == 200
        assert msgpack.unpackb(answer.content)["num_chunks"] == 3
        assert int(http.get("/v1/stats").json()["service"]["fast_lookups"]) == before  # the route answered
