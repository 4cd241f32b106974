"""What `kvstore serve` prints at start: one "ready" line, and no library's INFO lines when SIGINT
arrives during start-up (regressions of issue 25: "ready at" twice, three torch INFO lines)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from service.process import free_port, serve_command_line, write_config
from tests.service.conftest import LAYOUT


def _start(tmp_path: Path) -> subprocess.Popen[str]:
    config = write_config(tmp_path, layout=LAYOUT)
    env = {**os.environ, "KVSTORE_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.Popen(serve_command_line(config, "--port", str(free_port()), "--log-level", "info"),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _read_until(proc: subprocess.Popen[str], marker: str) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if marker in line:
            return lines
    raise AssertionError(f"the daemon exited ({proc.wait()}) before printing {marker!r}:\n" + "\n".join(lines))


def test_ready_is_said_once(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    try:
        lines = _read_until(proc, "ready at")
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "\n".join(lines) + "\n" + rest
    assert proc.returncode == 0, output
    assert output.count("ready at") == 1, output


def test_sigint_during_start_up_prints_no_library_logging(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    try:
        lines = _read_until(proc, "listening on")  # checked and bound; the store not yet open
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "\n".join(lines) + "\n" + rest
    assert proc.returncode in (0, 130), output
    logged = [line for line in output.splitlines() if " INFO " in line or " DEBUG " in line]
    own = ("kvstore", "service", "tiers", "policies", "connector", "gpu_kernels")
    assert all(line.split(" INFO ")[-1].split(".")[0] in own for line in logged if " INFO " in line), output
    assert "torch" not in output and "Traceback" not in output, output
