"""LMCache writer and reader in two processes on one daemon: its default prefix hash (Python's hash()) names a
chunk the same in both only under a shared PYTHONHASHSEED; without it the plugin refuses in one line instead of
missing forever (issue: a fresh reader got 0 hits while the daemon held every chunk)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lmcache.v1.cache_engine", reason="LMCache is not installed: use scripts/integration_env.sh's env")

from tests.integration.conftest import ROOT, llama_layout
from tests.integration.test_lmcache import CHUNK, DIM, HEADS, LAYERS, NUM_CHUNKS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def run(mode: str, url: str, work: Path, seed: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    env["PYTHONPATH"] = str(ROOT)
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    out = work / f"{mode}-{seed}.json"
    proc = subprocess.run([sys.executable, "-m", "tests.integration.lmcache_process", mode, url, str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    report["log"] = proc.stdout + proc.stderr
    return report


@pytest.fixture
def daemon(daemon_factory: Any) -> Any:
    return daemon_factory(llama_layout(CHUNK, num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM))


def test_a_reader_in_another_process_hits_under_a_shared_hash_seed(daemon: Any, tmp_path: Path) -> None:
    assert "refused" not in run("store", daemon.url, tmp_path, "0")
    reader = run("retrieve", daemon.url, tmp_path, "0")
    assert reader["lookup_tokens"] == reader["retrieved_tokens"] == NUM_CHUNKS * CHUNK
    assert reader["identical"], "the reader got the writer's KV, byte for byte"


def test_without_a_hash_seed_the_plugin_refuses_in_one_line(daemon: Any, tmp_path: Path) -> None:
    report = run("store", daemon.url, tmp_path, None)
    assert "refused" in report, "the engine must not run with a plugin that can never hit across processes"
    lines = [x for x in report["log"].splitlines() if "differs per process" in x]
    assert lines and all("PYTHONHASHSEED=0" in x and "sha256_cbor" in x for x in lines), report["log"][-3000:]
