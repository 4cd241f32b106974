"""Temporary copies of the project's build inputs (setup.py, pyproject.toml, packages), for tests that build or edit them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILT = ("*.so", "*.pyd", "_compiled.sha256")  # what a build leaves beside the sources (setup.py)


def copy_sources(dest: Path, packages: tuple[str, ...] = ("kvstore", "policies"), *, builds: bool = False) -> Path:
    """setup.py, pyproject.toml, README.md and `packages` of this checkout, copied into `dest`; the builds an editable
    install left beside the sources only with `builds`. Returns `dest`, from which `packages` import."""
    skipped = ("__pycache__", "build", *(() if builds else BUILT))
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for package in packages:
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns(*skipped))
    return dest


def run_in(folder: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -c CODE` in `folder` (its packages first on the path, the checkout's after), INFO logs on stderr."""
    preamble = "import logging; logging.basicConfig(level=logging.INFO)\n"
    return subprocess.run([sys.executable, "-c", preamble + code], cwd=folder, capture_output=True, text=True,
                          check=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def build_wheel(source: Path, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`pip wheel` of `source` into `out` with this environment's setuptools and mypy (no build isolation, no network)."""
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                           str(out), str(source)], capture_output=True, text=True, timeout=900, check=False,
                          env={**os.environ, **env})
