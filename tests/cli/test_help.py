"""`kvstore --help` and each command's `--help` load no heavy dependency (torch, the engine, uvicorn).

Regression: cli.py imported the engine demo (and with it torch) at import time, so `kvstore --help`
took 8-10 s. Each command now imports its heavy dependencies only when it runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = ["serve", "plan", "replay", "bench", "stats", "demo", "store-demo", "pd-proxy"]
ROOT = Path(__file__).resolve().parents[2]


def _probe(mode: str, *args: str) -> subprocess.CompletedProcess[str]:
    """tests/programs/cli_probe.py in a new interpreter (not the fork server's: it has torch loaded)."""
    return subprocess.run([sys.executable, "-m", "tests.programs.cli_probe", mode, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _help(*args: str) -> subprocess.CompletedProcess[str]:
    return _probe("help", *args, "--help")


def test_top_level_help_imports_no_heavy_module() -> None:
    proc = _help()
    assert proc.returncode == 0, proc.stderr
    assert "usage ok" in proc.stdout
    for command in COMMANDS:
        assert command in proc.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help_imports_no_heavy_module(command: str) -> None:
    proc = _help(command)
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout


def test_a_config_too_large_for_the_machine_is_refused_before_torch_loads(tmp_path: Path) -> None:
    """Regression: the memory check ran after `kvstore.store` (and torch) was imported, so refusing
    an oversized host tier took 8-10 s instead of well under one."""
    config = tmp_path / "big.toml"
    config.write_text('model_id = "llama-3-8b"\n[[tiers]]\nkind = "host"\ncapacity = "64TiB"\n')
    proc = _probe("refused", "serve", "--config", str(config), "--port", "1")
    assert "refused without torch" in proc.stdout, proc.stdout + proc.stderr
    assert "does not fit this machine" in proc.stderr
