"""Hostile requests against a real daemon: nested, truncated, oversized and slow bodies, slow
headers and clients that leave mid-body. Each gets a 4xx (or its socket closed), never a 5xx,
and /healthz keeps answering."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import pytest

from tests.service.conftest import TOKENS, start_daemon

AUTH = {"Authorization": f"Bearer {TOKENS['a']}"}
STRUCTURED = ["/v1/lookup", "/v1/chunks/put", "/v1/chunks/get", "/v1/chunks/delete", "/v1/shm/segments",
              "/v1/shm/segments/put", "/v1/shm/segments/get", "/v1/shm/segments/close"]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("guarded")
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True}]
    d = start_daemon(root, tenants=tenants, service={"header_timeout_s": 1.0, "body_timeout_s": 2.0})
    yield d
    d.close()


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _server_closed(sock: socket.socket, within_s: float) -> bool:
    """True when the server closes the socket (recv returns EOF) within `within_s`."""
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except (TimeoutError, ConnectionResetError):
        return False


def _status_counts(d: Any, status: str) -> int:
    with d.client(TOKENS["a"]) as http:
        text = http.get("/metrics").text
    return sum(int(float(line.split()[-1])) for line in text.splitlines()
               if line.startswith("kvstore_http_requests_total") and f'status="{status}"' in line)


@pytest.mark.parametrize("path", STRUCTURED)
def test_deep_nesting_and_bare_arrays_are_400(guarded: Any, path: Any) -> None:
    bodies = [("application/json", b"[" * 100_000 + b"]" * 100_000),
              ("application/json", b'{"keys": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
              ("application/json", b"[[[[1]]]]"),
              ("application/json", b'{"keys": ["ab'),  # truncated
              ("application/msgpack", b"\x91" * 100_000 + b"\x01"),
              ("application/msgpack", msgpack.packb([[[[b"x"]]]]))]
    with guarded.client(TOKENS["a"]) as http:
        for content_type, body in bodies:
            reply = http.post(path, content=body, headers={"Content-Type": content_type})
            assert reply.status_code in (400, 422), f"{path} {body[:20]!r}: {reply.status_code} {reply.text[:200]}"
            assert reply.json()["detail"]
        assert http.get("/healthz").status_code == 200


def test_oversized_declared_body_is_refused_before_it_is_read(guarded: Any) -> None:
    sock = _raw(guarded.url)
    sock.sendall(f"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKENS['a']}\r\n"
                 "Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n".encode())
    sock.settimeout(5)
    head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    sock.close()


def test_chunked_body_announcing_2_to_64_bytes_gets_408(guarded: Any) -> None:
    sock = _raw(guarded.url)
    sock.sendall(f"PUT /v1/chunks/{'ab' * 16} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKENS['a']}\r\n"
                 "Transfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc".encode())
    sock.settimeout(10)
    head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 408") or head.startswith(b"HTTP/1.1 400"), head[:200]
    assert _server_closed(sock, 5)


def test_slow_headers_and_slow_bodies_are_closed(guarded: Any) -> None:
    sockets = [_raw(guarded.url) for _ in range(40)]
    for i, sock in enumerate(sockets):
        sock.sendall(b"GET /healthz HTTP/1.1\r\n" if i % 2 else
                     f"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKENS['a']}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode())
    for _ in range(4):  # keep trickling: each byte would reset uvicorn's own keep-alive timer
        time.sleep(0.5)
        for sock in sockets:
            try:
                sock.sendall(b"X")
            except OSError:
                pass
        assert httpx.get(f"{guarded.url}/healthz", timeout=5).status_code == 200
    assert all(_server_closed(sock, 10) for sock in sockets)


def test_client_leaving_mid_body_is_no_error(guarded: Any) -> None:
    before, left_before = _status_counts(guarded, "500"), _status_counts(guarded, "499")
    for _ in range(20):
        sock = _raw(guarded.url)
        sock.sendall(f"POST /v1/chunks/put HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKENS['a']}\r\n"
                     "Content-Type: application/msgpack\r\nContent-Length: 100000\r\n\r\n".encode() + b"\0" * 5000)
        sock.close()
    time.sleep(1.0)
    assert _status_counts(guarded, "500") == before
    assert _status_counts(guarded, "499") >= left_before + 15  # counted as "client closed", not as errors
    log = guarded.log.read_text()
    assert "unexpected error" not in log and "Traceback" not in log
    assert httpx.get(f"{guarded.url}/healthz").status_code == 200
