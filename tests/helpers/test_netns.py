"""tests/helpers/netns.py: two servers on the same fixed port at once, each in its own network namespace, each
answering only its own clients (what lets the README's blocks on ports 8765 and 8000 run side by side)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import netns

pytestmark = pytest.mark.skipif(not netns.available(), reason="this machine allows no user and network namespaces")

SERVE_AND_ASK = """
import socket, sys, threading
server = socket.create_server(("127.0.0.1", 18765))
def answer():
    conn, _ = server.accept()
    conn.sendall(sys.argv[1].encode())
    conn.close()
threading.Thread(target=answer, daemon=True).start()
threading.Event().wait(1.0)  # both servers are up before either asks: the port is taken twice at once
with socket.create_connection(("127.0.0.1", 18765), timeout=5) as client:
    print(client.recv(64).decode())
"""


def test_two_servers_bind_one_port_at_once_and_each_answers_its_own() -> None:
    procs = [subprocess.Popen(netns.wrap([sys.executable, "-c", SERVE_AND_ASK, name]), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for name in ("first", "second")]
    outputs = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert [out.strip() for out, _ in outputs] == ["first", "second"]


def test_within_one_namespace_the_port_binds_once() -> None:
    """The premise of the test above: on one network a port can be bound once."""
    twice = ("import socket\ns = socket.create_server(('127.0.0.1', 18765))\n"
             "socket.create_server(('127.0.0.1', 18765))")
    again = subprocess.run(netns.wrap([sys.executable, "-c", twice]), capture_output=True, text=True, timeout=30)
    assert again.returncode != 0 and "Address already in use" in again.stderr, again.stderr
