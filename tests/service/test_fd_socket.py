"""Issue 27, item 2: no peer can hold the descriptor socket shut. With 8 idle and 8 trickling
connections held open (reopened as soon as the daemon closes them), a client still gets its
segment's descriptor within a second; a peer past its cap of connections is closed at once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from connector.client_segment import DescriptorSocketBusy, receive_fd
from connector.daemon_http import DaemonHTTP
from kvstore.wire_types import SegmentAnswer, SegmentRequest
from service.process import Daemon
from tests.service.conftest import TOKENS, start_daemon

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "fd-socket-admin-token-0123"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True}]
    d = start_daemon(tmp_path_factory.mktemp("fds"), host_chunks=16, tenants=tenants,
                     service={"admin_token": ADMIN, "shm_socket_max_per_peer": 8})
    yield d
    d.close()


def _create(daemon: Daemon) -> SegmentAnswer:
    http = DaemonHTTP(daemon.url, TOKENS["a"], 30.0)
    try:
        return http.call("POST", "/v1/shm/segments", SegmentRequest(slots=1), SegmentAnswer)
    finally:
        http.close()


def _fd_stats(daemon: Daemon) -> dict[str, int]:
    stats = httpx.get(f"{daemon.url}/v1/stats", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).json()
    return {k: v for k, v in stats["service"].items() if k.startswith("fd_socket")}


def _peers(socket_path: str, kind: str, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.service.fd_socket_peers", socket_path, kind, "8",
                             str(seconds)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_hand_over_takes_under_a_second_while_idle_and_trickling_peers_hold_connections(daemon: Daemon) -> None:
    socket_path = _create(daemon).socket
    before = _fd_stats(daemon)
    idle, trickle = _peers(socket_path, "idle", 30), _peers(socket_path, "trickle", 30)
    try:
        time.sleep(1.5)  # past one deadline: the daemon has closed and the peers reopened connections
        assert _fd_stats(daemon)["fd_socket_open"] >= 12  # most of the 16 held at any moment
        for _ in range(3):
            segment = _create(daemon)
            started = time.monotonic()
            fd = receive_fd(segment.socket, segment.id, TOKENS["a"])
            took = time.monotonic() - started
            assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")  # the segment itself came
            os.close(fd)
            assert took < 1.0, f"hand-over took {took:.2f} s"
        during = _fd_stats(daemon)
        assert during["fd_socket_expired"] - before["fd_socket_expired"] >= 8  # idle peers cut at their deadline
    finally:
        for proc in (idle, trickle):
            proc.kill()
            proc.wait()


def _wait_closed(daemon: Daemon) -> None:
    """Until the daemon has seen every earlier connection close (its counts are of open connections)."""
    end = time.monotonic() + 30
    while _fd_stats(daemon)["fd_socket_open"] and time.monotonic() < end:
        time.sleep(0.05)
    assert _fd_stats(daemon)["fd_socket_open"] == 0


def test_a_peer_past_its_cap_is_closed_at_once(daemon: Daemon) -> None:
    _wait_closed(daemon)
    segment = _create(daemon)
    held = []
    try:
        for _ in range(8):  # this process's cap
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(segment.socket)
            held.append(sock)
        time.sleep(0.2)  # the daemon accepted all eight
        started = time.monotonic()
        with pytest.raises((DescriptorSocketBusy, ConnectionError)):
            receive_fd(segment.socket, segment.id, TOKENS["a"])
        assert time.monotonic() - started < 1.0  # closed at once, not at the deadline
    finally:
        for sock in held:
            sock.close()
    _wait_closed(daemon)
    fd = receive_fd(segment.socket, segment.id, TOKENS["a"])  # the cap counts open connections only
    os.close(fd)
