"""Every documented `python -m` module runs or refuses in one line: bench.hostile without schemathesis
names the extra to install (regression of issue 25: a ModuleNotFoundError traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_hostile_without_schemathesis_names_the_extra(tmp_path: Path) -> None:
    # schemathesis is installed here; a package of that name that fails to import stands in for its absence
    (tmp_path / "schemathesis").mkdir()
    (tmp_path / "schemathesis" / "__init__.py").write_text("raise ImportError('not installed (test)')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    done = subprocess.run([sys.executable, "-m", "bench.hostile", "--examples", "1"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "needs schemathesis" in lines[0] and "bash scripts/setup.sh test" in lines[0]
