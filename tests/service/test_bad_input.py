"""Bad input gets a 4xx with a clear message, never a 5xx, and the daemon keeps serving: hand-written
cases (malformed msgpack, wrong sizes and layouts, huge bodies, path tricks) and a schemathesis run
against the daemon's own OpenAPI schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from service.process import Daemon
from tests.service.conftest import LAYOUT, TOKENS

KEY = "ab" * 16
MP = {"Content-Type": "application/msgpack"}
CASES = [
    # (method, path, kwargs, status, words the message must contain)
    ("POST", "/v1/lookup", {"content": b"\xc1\xff\x00", "headers": MP}, 400, "msgpack"),
    ("POST", "/v1/lookup", {"content": msgpack.packb([1, 2]), "headers": MP}, 400, "map"),
    ("POST", "/v1/lookup", {"content": b"{not json", "headers": {"Content-Type": "application/json"}}, 400, "JSON"),
    ("POST", "/v1/lookup", {"content": msgpack.packb({"keys": [b"short"]}), "headers": MP}, 400, "16 bytes"),
    ("POST", "/v1/lookup", {"json": {"token_ids": [-1, 2]}}, 400, "non-negative"),
    ("POST", "/v1/lookup", {"json": {"token_ids": [[1], [2]]}}, 400, "1-D"),
    ("POST", "/v1/lookup", {"json": {"token_ids": "abc"}}, 400, "token_ids"),
    ("POST", "/v1/lookup", {"json": {}}, 400, "token_ids"),
    ("PUT", f"/v1/chunks/{KEY}", {"content": b"\0" * (LAYOUT.chunk_bytes - 1)}, 422, str(LAYOUT.chunk_bytes)),
    ("PUT", f"/v1/chunks/{KEY}", {"content": b"\0" * LAYOUT.chunk_bytes, "headers": {"X-KV-Layout": "0" * 16}},
     422, "layout"),
    ("PUT", f"/v1/chunks/{KEY}", {"content": b"\0" * (2 << 20)}, 413, "max_body_bytes"),
    ("PUT", "/v1/chunks/..%2F..%2Fetc%2Fpasswd", {"content": b"x"}, 404, "no route"),
    ("GET", "/v1/chunks/zz", {}, 422, "pattern"),
    ("POST", "/v1/chunks/put", {"content": msgpack.packb({"keys": [bytes(16)], "data": b"12"}), "headers": MP},
     422, "each chunk is"),
    ("POST", "/v1/chunks/put", {"json": {"keys": [KEY], "data": "not-hex"}}, 400, "hex"),
    ("POST", "/v1/chunks/get", {"json": {"keys": [KEY] * 65}}, 413, "max_batch_chunks"),
    ("POST", "/v1/shm/segments", {"json": {"slots": "many"}}, 400, "'slots'"),
    ("POST", "/v1/shm/segments/get", {"json": {"segment": "no-such-id", "keys": [KEY], "slots": [0]}}, 404, "segment"),
    ("POST", "/v1/shm/segments/put", {"json": {"segment": "x", "keys": [KEY], "slots": [True]}}, 400, "$.slots[0]"),
    ("POST", "/v1/shm/acquire", {"json": {"keys": [KEY]}}, 404, "no route"),  # the retired arena plane
]


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "words"), CASES,
                         ids=[f"{c[0]} {c[1][:24]} {c[3]}" for c in CASES])
def test_bad_request_is_a_clear_4xx(tenant_daemon: Any, method: Any, path: Any, kwargs: Any, status: Any, words: Any) -> None:
    with tenant_daemon.client(TOKENS["a"]) as http:
        reply = http.request(method, path, **kwargs)
        assert reply.status_code == status, reply.text
        assert words.lower() in reply.json()["detail"].lower(), reply.text
        assert http.get("/healthz").status_code == 200


def test_streamed_body_over_the_limit_is_413(tenant_daemon: Any) -> None:
    def chunks() -> Iterator[Any]:
        for _ in range(40):
            yield b"\0" * 65536  # 2.5 MiB without a Content-Length

    with tenant_daemon.client(TOKENS["a"]) as http:
        reply = http.put(f"/v1/chunks/{KEY}", content=chunks())
        assert reply.status_code == 413 and "limit" in reply.json()["detail"]


def _fuzz(url: str, max_examples: int) -> int:
    """Run schemathesis' positive and negative examples for every operation; returns how many calls ran."""
    auth = {"Authorization": f"Bearer {TOKENS['a']}"}
    api = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=auth)  # the schema needs a token too
    calls = []

    for result in api.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]
        for mode in GenerationMode:  # type: ignore[attr-defined]

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=max_examples, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            def check(case: Any) -> None:
                response = case.call(headers=auth)
                calls.append(response.status_code)
                assert response.status_code < 500, f"{case.method} {case.path}: {response.status_code} {response.text[:300]}"
                if response.status_code >= 400:
                    assert response.json()["detail"], response.text

            try:
                check()
            except Unsatisfiable:  # nothing can be negative in an operation without inputs (GET /healthz)
                assert mode is GenerationMode.NEGATIVE
    return len(calls)


@pytest.mark.timeout(240)  # every operation in both generation modes: about 40 s on a loaded 2-core machine
def test_schemathesis_never_a_5xx(tenant_daemon: Daemon) -> None:
    """Every operation of the daemon's OpenAPI schema, as tenant a: no 5xx, every 4xx explains itself."""
    assert _fuzz(tenant_daemon.url, max_examples=3) > 30
    assert httpx.get(f"{tenant_daemon.url}/healthz").status_code == 200


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_schemathesis_long_run(tenant_daemon: Any) -> None:
    assert _fuzz(tenant_daemon.url, max_examples=100) > 1000
    assert httpx.get(f"{tenant_daemon.url}/healthz").status_code == 200
