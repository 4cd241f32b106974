"""`kvstore --help` and each command's `--help` load no heavy dependency (torch, the engine, uvicorn).

Regression: cli.py imported the engine demo (and with it torch) at import time, so `kvstore --help`
took 8-10 s. Each command now imports its heavy dependencies only when it runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

COMMANDS = ["serve", "plan", "replay", "bench", "stats", "demo", "store-demo"]
HEAVY = ["torch", "uvicorn", "fastapi", "connector.engine", "kvstore.store", "numpy"]

PROBE = """
import sys
from kvstore.cli import app
try:
    app(sys.argv[1:])
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
loaded = [name for name in {heavy!r} if name in sys.modules]
assert not loaded, f"--help imported {{loaded}}"
print("usage ok")
"""


def _help(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *args, "--help"],
                          capture_output=True, text=True, timeout=120)


def test_top_level_help_imports_no_heavy_module() -> None:
    proc = _help()
    assert proc.returncode == 0, proc.stderr
    assert "usage ok" in proc.stdout
    for command in COMMANDS:
        assert command in proc.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help_imports_no_heavy_module(command: Any) -> None:
    proc = _help(command)
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout


REFUSAL_PROBE = """
import sys
from kvstore.cli import app
try:
    app(sys.argv[1:])
except SystemExit as exc:
    assert exc.code == 2, exc.code
assert "torch" not in sys.modules, "the refusal imported torch"
print("refused without torch")
"""


def test_a_config_too_large_for_the_machine_is_refused_before_torch_loads(tmp_path: Path) -> None:
    """Regression: the memory check ran after `kvstore.store` (and torch) was imported, so refusing
    an oversized host tier took 8-10 s instead of well under one."""
    config = tmp_path / "big.toml"
    config.write_text('model_id = "llama-3-8b"\n[[tiers]]\nkind = "host"\ncapacity = "64TiB"\n')
    proc = subprocess.run([sys.executable, "-c", REFUSAL_PROBE, "serve", "--config", str(config), "--port", "1"],
                          capture_output=True, text=True, timeout=120)
    assert "refused without torch" in proc.stdout, proc.stdout + proc.stderr
    assert "does not fit this machine" in proc.stderr
