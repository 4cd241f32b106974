"""`VLLMServer` picks its port before `vllm serve` binds it (a minute later, after imports and the model load): a
server whose port another process took meanwhile starts again on a new one. A stand-in API server (a real
process binding the port it is given and answering /health) plays `vllm serve`; the port is really taken."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bench.vllm_server import BIND_RETRIES, ServeSpec, VLLMServer

STAND_IN = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
argv = sys.argv[1:]
http.server.HTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Health).serve_forever()
"""


def _launch(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:  # the arguments `vllm serve` would get, to a stand-in that binds its --port
        return subprocess.Popen([sys.executable, "-c", STAND_IN, *argv], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _spec(tmp_path: Path) -> ServeSpec:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return ServeSpec(model_dir=tmp_path / "model")


def test_a_server_whose_port_was_taken_starts_again_on_another(tmp_path: Path) -> None:
    server = VLLMServer(_spec(tmp_path), tmp_path / "serve.log", launcher=_launch)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", server.port))  # another process's listener, bound before the server binds
        holder.listen()
        taken = server.port
        server.start(timeout_s=60)
        try:
            assert server.port != taken
            assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
            assert "Address already in use" in server.log.read_text()  # the first start did fail on it
        finally:
            server.stop()


def test_a_server_that_fails_otherwise_is_not_started_again(tmp_path: Path) -> None:
    def failing(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen([sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    server = VLLMServer(_spec(tmp_path), tmp_path / "serve.log", launcher=failing)
    with pytest.raises(RuntimeError, match="exited with 3"):
        server.start(timeout_s=60)
    assert server.log.read_text().count("no model here") == 1 and BIND_RETRIES >= 1
