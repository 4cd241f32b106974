"""Run `kvstore pd-proxy` as a child process in front of vLLM instances: start (wait for its ready line),
read its counters, stop. Used by `kvstore bench pd` and the PD integration test."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx

from bench.vllm_server import parse_metrics
from service.process import CLI, free_port

ROOT = Path(__file__).resolve().parents[1]


class PDProxy:
    """One `kvstore pd-proxy` on a free port of 127.0.0.1."""

    def __init__(self, prefill: Sequence[str], decode: Sequence[str], log: Path, *, extra_args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.args = [sys.executable, *CLI, "pd-proxy", "--port", str(self.port), *extra_args]
        self.args += [a for url in prefill for a in ("--prefill", url)] + [a for url in decode for a in ("--decode", url)]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> PDProxy:
        """Start and wait for its "ready at" line.

        Raises:
            RuntimeError: it exited or did not say ready in time (its log in the message).
        """
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while "ready at" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"kvstore pd-proxy did not start:\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        return self

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(f"{self.url}/metrics", timeout=30.0).text)

    def metric_total(self, name: str) -> float:
        """A counter summed over its label sets."""
        return sum(v for k, v in self.metrics().items() if k == name or k.startswith(name + "{"))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def __enter__(self) -> PDProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
