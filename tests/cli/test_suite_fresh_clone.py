"""`kvstore replay suite` in a copy of the tracked tree: every workload runs (bundled samples for the
traces a clone lacks), the files it writes are the ones named, and `git status` stays clean."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.sim.generators import GENERATORS

REPO = Path(__file__).resolve().parents[2]


def _tracked_copy(root: Path) -> Path:
    """The files git tracks (or would track), copied into a new repository with one commit."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], cwd=root, check=True)
    return root


@pytest.mark.timeout(900)
def test_suite_in_a_fresh_copy_writes_only_what_it_is_told(tmp_path: Path) -> None:
    root = _tracked_copy(tmp_path / "kvstore")
    env = {**os.environ, "PYTHONPATH": str(root), "KVSTORE_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "200"}
    env.pop("KVSTORE_TRACES", None)
    done = subprocess.run([sys.executable, "-c", "from kvstore.cli import app; app()", "replay", "suite",
                           "--policy", "lru", "--policy", "adaptive", "--capacity", "5",
                           "--json", "out/replay_suite.json"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=850)
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: a check failed, and said so
    if done.returncode == 1:
        assert "check(s) failed" in done.stderr and "- FAIL" in done.stdout
    assert "skip " not in done.stdout, done.stdout
    assert "running the bundled mooncake-sample" in done.stdout
    assert "- SKIP conversation @ 5%" in done.stdout  # the full-trace check says why it cannot run
    records = json.loads((root / "out" / "replay_suite.json").read_text())
    assert len({r["member"] for r in records}) == 3 + len(GENERATORS)
    status = subprocess.run(["git", "status", "--porcelain", "--ignored=no"], cwd=root, capture_output=True,
                            text=True, check=True).stdout
    assert status == "", status
