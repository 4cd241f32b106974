"""LeanHTTP against a real stdlib HTTP server: keep-alive reuse, a connection closed while idle is
reopened once, a dead server is DaemonUnreachable, unix sockets, one connection per thread."""

from __future__ import annotations

import http.server
import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from connector.lean_http import DaemonUnreachable, LeanHTTP
from kvstore.errors import KVStoreError


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append((self.path, body, self.headers.get("Authorization")))  # type: ignore[attr-defined]
        answer = b"echo:" + body
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (answer[:3], answer[3:], b""):
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            return
        if self.path == "/close":  # no length: the body runs to the end of the stream
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(answer)
            self.close_connection = True
            return
        if self.path == "/missing":
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "19")
            self.end_headers()
            self.wfile.write(b'{"detail":"nope!!"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/msgpack")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, bytes, str | None]] = []
        self.connections: list[socket.socket] = []

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        self.connections.append(request)
        super().process_request(request, client_address)


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str) -> None:
        super().__init__(path, _Handler)
        self.requests: list[tuple[str, bytes, str | None]] = []


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: _Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_requests_reuse_one_connection_and_send_headers(server: _Server) -> None:
    http = LeanHTTP(_url(server), {"Authorization": "Bearer t"}, timeout_s=5.0)
    answers = [http.request("POST", "/v1/lookup", f"b{i}".encode(), "application/msgpack") for i in range(5)]
    assert [a.content for a in answers] == [f"echo:b{i}".encode() for i in range(5)]
    assert all(a.status == 200 and a.content_type == "application/msgpack" for a in answers)
    assert len(server.connections) == 1
    assert server.requests[0] == ("/v1/lookup", b"b0", "Bearer t")
    http.close()


def test_chunked_close_delimited_and_error_answers(server: _Server) -> None:
    http = LeanHTTP(_url(server), {}, timeout_s=5.0)
    assert http.request("POST", "/chunked", b"abcdef").content == b"echo:abcdef"
    assert http.request("POST", "/x", b"after chunked").content == b"echo:after chunked"  # stream still in step
    assert http.request("POST", "/close", b"bye").content == b"echo:bye"
    assert http.request("POST", "/x", b"reopened").content == b"echo:reopened"
    missing = http.request("POST", "/missing", b"")
    assert (missing.status, missing.content, missing.content_type) == (404, b'{"detail":"nope!!"}', "application/json")
    assert http.request("POST", "/x", b"").content == b"echo:"
    assert len(server.connections) == 2  # one before the close-delimited answer, one after
    http.close()


def test_connection_closed_while_idle_is_reopened_once(server: _Server) -> None:
    http = LeanHTTP(_url(server), {}, timeout_s=5.0)
    assert http.request("POST", "/a", b"1").content == b"echo:1"
    server.connections[0].shutdown(socket.SHUT_RDWR)  # what a keep-alive timeout does to an idle connection
    assert http.request("POST", "/b", b"2").content == b"echo:2"
    assert len(server.connections) == 2
    assert [r[0] for r in server.requests] == ["/a", "/b"]  # the request was sent once to the live server
    http.close()


def test_dead_server_is_daemon_unreachable(server: _Server) -> None:
    url = _url(server)
    server.shutdown()
    server.server_close()
    http = LeanHTTP(url, {}, timeout_s=2.0)
    with pytest.raises(DaemonUnreachable, match="127.0.0.1"):
        http.request("POST", "/v1/lookup", b"x")
    assert issubclass(DaemonUnreachable, KVStoreError)


def test_each_thread_has_its_own_connection(server: _Server) -> None:
    http = LeanHTTP(_url(server), {}, timeout_s=5.0)
    results: list[bytes] = []

    def worker(i: int) -> None:
        for j in range(3):
            results.append(http.request("POST", "/t", f"{i}.{j}".encode()).content)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(f"echo:{i}.{j}".encode() for i in range(3) for j in range(3))
    assert len(server.connections) == 3
    http.close()
    with pytest.raises(DaemonUnreachable, match="closed"):
        http.request("POST", "/t", b"after close")


def test_unix_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "d.sock")
    srv = _UnixServer(path)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        http = LeanHTTP(f"unix://{path}", {}, timeout_s=5.0)
        assert http.request("POST", "/u", b"hi").content == b"echo:hi"
        http.close()
    finally:
        srv.shutdown()
        srv.server_close()


def test_bad_url_names_the_forms() -> None:
    with pytest.raises(KVStoreError, match="http://HOST:PORT or unix://"):
        LeanHTTP("ftp://x", {}, 1.0)
