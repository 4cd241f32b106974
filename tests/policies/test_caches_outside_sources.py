"""numba's cache goes under the user's cache directory, never into the source tree
(regression of issue 25: policies/compression/__pycache__/*.nbc in a fresh clone)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KERNEL_RUN = """
import numpy as np
from policies.compression.numba_support import optional_kernels
kernels = optional_kernels("policies.compression.plane_kernels", "numpy copies")
assert kernels is not None
import numba
print(numba.config.CACHE_DIR)
"""


def test_numba_caches_under_the_user_cache_dir(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", KERNEL_RUN], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == str(tmp_path / "xdg" / "kvstore" / "numba")

