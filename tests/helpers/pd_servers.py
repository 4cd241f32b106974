"""Real servers for the pd-proxy tests: stand-in OpenAI servers as child processes (tests/programs/
openai_standin.py) and the proxy itself on uvicorn in a thread of the test process, each on a free port."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from service.pd_proxy.app import create_app
from service.pd_proxy.config import InstanceSpec, ProxyConfig
from service.pd_proxy.state import ProxyState
from service.process import free_port
from tests.helpers.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]


class Standin:
    """One stand-in engine server in a child process."""

    def __init__(self, name: str, log_dir: Path, *, api_key: str | None = None, wait: bool = True) -> None:
        """Start it; with `wait`, return once it answers (else call `wait_up`, so that several start at once)."""
        self.name = name
        self.log = log_dir / f"{name}.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "tests.programs.openai_standin", "--port", str(self.port), "--name", name]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([*args, *(["--api-key", api_key] if api_key else [])], cwd=ROOT,
                                         stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_up()

    def wait_up(self, timeout_s: float = 120.0) -> Standin:
        if not wait_until(self.is_up, timeout_s, poll_s=0.1):
            self.kill()
            raise RuntimeError(f"stand-in {self.name} did not start in {timeout_s:g} s; see {self.log}")
        return self

    def is_up(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=1.0).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    def control(self, action: str, **settings: Any) -> Any:
        return httpx.post(f"{self.url}/control/{action}", json=settings or None, timeout=10.0).json()

    def received(self) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.url}/control/received", timeout=10.0).json())

    def num_held(self) -> int:
        return int(httpx.get(f"{self.url}/control/held", timeout=10.0).json()["held"])

    def kill(self) -> None:
        """SIGKILL: the instance dies as a crashed engine does, its port refusing connections."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


def standins_up(log_dir: Path, api_keys: Mapping[str, str | None]) -> Iterator[dict[str, Standin]]:
    """Stand-ins named by `api_keys` (each with its API key, or None), started at once and all up; killed at the
    end. For module fixtures: `yield from standins_up(...)`."""
    servers = {name: Standin(name, log_dir, api_key=key, wait=False) for name, key in api_keys.items()}
    try:
        for server in servers.values():
            server.wait_up()
        yield servers
    finally:
        for server in servers.values():
            server.kill()


Instance = Standin | str | InstanceSpec  # a stand-in, a bare URL, or a spec with a node id


class ProxyServer:
    """`kvstore pd-proxy`'s app on uvicorn in a thread, on a free port of 127.0.0.1."""

    def __init__(self, prefill: Sequence[Instance], decode: Sequence[Instance], **options: Any) -> None:
        """`prefill`/`decode`: stand-ins, bare URLs (of nothing, for an unreachable instance) or specs with a node id."""
        options.setdefault("health_interval_s", 0.2)
        options.setdefault("health_timeout_s", 1.0)
        self.config = ProxyConfig(prefill=tuple(_spec(s) for s in prefill),
                                  decode=tuple(_spec(s) for s in decode), **options)
        self.app = create_app(self.config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="pd-proxy", daemon=True)

    def __enter__(self) -> ProxyServer:
        self.thread.start()
        if not wait_until(lambda: self.server.started, 30.0):
            raise RuntimeError("the proxy did not start in 30 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    @property
    def state(self) -> ProxyState:
        return self.app.state.proxy  # type: ignore[no-any-return]


def _spec(server: Instance) -> InstanceSpec:
    if isinstance(server, InstanceSpec):
        return server
    return InstanceSpec(server if isinstance(server, str) else server.url)
