"""The optional mypyc build of the hot eviction policies: it decides exactly as the pure Python
sources do, it is never loaded for sources it was not built from, and pure Python is used (and
said so) without it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from policies.eviction import _native

ROOT = Path(__file__).resolve().parents[2]


def _decisions(workload: str, policies: str, **env: str) -> dict[str, object]:
    """tests/programs/policy_decisions.py in a fresh interpreter (the implementation is chosen on import)."""
    done = subprocess.run([sys.executable, "-m", "tests.programs.policy_decisions", workload, policies], cwd=ROOT,
                          check=True, capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_compiled_policies_decide_exactly_as_the_pure_python_sources() -> None:
    """Same hits and the same victims, in the same order, on a suite workload where `adaptive`
    switches experts (gen:chat), for every compiled policy."""
    names = "adaptive,lru,arc,s3fifo"
    pure = _decisions("gen:chat", names, KVSTORE_PURE_PYTHON="1")
    assert pure.pop("implementation") == "python"
    compiled = _decisions("gen:chat", names, KVSTORE_PURE_PYTHON="")
    if compiled.pop("implementation") != "mypyc":
        pytest.skip("no mypyc build for these sources (python -m policies.eviction.build_native)")
    assert {k: v[:2] for k, v in compiled.items()} == {k: v[:2] for k, v in pure.items()}  # type: ignore[index]
    assert all(hits > 0 for hits, _, _ in pure.values())  # type: ignore[has-type, misc]


def test_without_a_build_the_pure_sources_run_and_the_log_says_so(tmp_path: Path) -> None:
    code = ("import logging; logging.basicConfig(level=logging.INFO)\n"
            "import policies.eviction.adaptive as a; print(a.__file__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True,
                          env={**os.environ, "KVSTORE_NATIVE_CACHE": str(tmp_path), "KVSTORE_PURE_PYTHON": ""}, timeout=120)
    assert done.stdout.strip().endswith("adaptive.py")
    assert "eviction policies: pure Python (no mypyc build" in done.stderr


def test_an_edited_source_gets_another_build_folder(tmp_path: Path) -> None:
    """Regression guard for stale builds: the folder a build is loaded from is named by the hash of
    the sources, so a build made before an edit is never loaded for the edited source."""
    for name in _native.COMPILED + _native.TYPED_BY:
        shutil.copy(_native.HERE / f"{name}.py", tmp_path / f"{name}.py")
    assert _native.build_key(tmp_path, "1.0") == _native.build_key(_native.HERE, "1.0")
    source = tmp_path / "adaptive.py"
    source.write_text(source.read_text().replace("LEAD_Z = ", "LEAD_Z = 0.5 + "))
    assert _native.build_key(tmp_path, "1.0") != _native.build_key(_native.HERE, "1.0")
    assert _native.build_key(_native.HERE, "1.0") != _native.build_key(_native.HERE, "1.1")
