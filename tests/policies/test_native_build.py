"""The mypyc build of the hot eviction policies that `pip install` puts beside the sources: it decides exactly as the
pure Python sources do, it is passed over once the sources differ from what it was built from (an edited `.py` of
an editable install), and pure Python runs, said so in the log, without it or with KVSTORE_PURE_PYTHON=1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from policies.eviction import _native
from tests.helpers.source_copy import build_wheel, copy_sources, run_in

ROOT = Path(__file__).resolve().parents[2]
REPORT = ("from policies.eviction import policy_implementation\n"
          "import policies.eviction.adaptive as a, policies.eviction.lru as l\n"
          "print(policy_implementation(), a.__file__, l.__file__, 'EDITED' in vars(a))")
NO_BUILD = "no mypyc build beside these sources (an editable install with mypy in its build environment makes one)"


def _decisions(workload: str, policies: str, **env: str) -> dict[str, object]:
    """tests/programs/policy_decisions.py in a fresh interpreter (the implementation is chosen on import)."""
    done = subprocess.run([sys.executable, "-m", "tests.programs.policy_decisions", workload, policies], cwd=ROOT,
                          check=True, capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _report(folder: Path, **env: str) -> tuple[str, str, str, bool, str]:
    """Which implementation a fresh interpreter in `folder` chose, the files of adaptive and lru, whether adaptive
    has the edit of the tests below, and the log."""
    done = run_in(folder, REPORT, **{"KVSTORE_PURE_PYTHON": "", **env})
    implementation, adaptive, lru, edited = done.stdout.split()
    return implementation, adaptive, lru, edited == "True", done.stderr


def test_compiled_policies_decide_exactly_as_the_pure_python_sources() -> None:
    """Same hits and the same victims, in the same order, on a suite workload where `adaptive`
    switches experts (gen:chat), for every compiled policy."""
    if _native.build_state() != "fresh":
        pytest.skip(NO_BUILD)
    names = "adaptive,lru,arc,s3fifo"
    pure = _decisions("gen:chat", names, KVSTORE_PURE_PYTHON="1")
    assert pure.pop("implementation") == "python"
    compiled = _decisions("gen:chat", names, KVSTORE_PURE_PYTHON="")
    assert compiled.pop("implementation") == "mypyc"
    assert {k: v[:2] for k, v in compiled.items()} == {k: v[:2] for k, v in pure.items()}  # type: ignore[index]
    assert all(hits > 0 for hits, _, _ in pure.values())  # type: ignore[has-type, misc]


def test_without_a_build_the_pure_sources_run_and_the_log_says_so(tmp_path: Path) -> None:
    implementation, adaptive, _, _, log = _report(copy_sources(tmp_path, ("policies",)))
    assert implementation == "python" and adaptive == str(tmp_path / "policies" / "eviction" / "adaptive.py")
    assert "eviction policies: pure Python (no mypyc build" in log


@pytest.mark.parametrize("edited", ["adaptive.py", "base.py"])
def test_a_build_of_other_sources_is_passed_over(tmp_path: Path, edited: str) -> None:
    """Regression guard for stale builds: a copy of the checkout's fresh build runs compiled; after an edit of a
    compiled source (or of one whose types it was built against), every policy runs from its `.py`, the edit in
    effect, and the log says why. KVSTORE_PURE_PYTHON=1 passes over a fresh build too."""
    if _native.build_state() != "fresh":
        pytest.skip(NO_BUILD)
    copy = copy_sources(tmp_path, ("policies",), builds=True)
    folder = copy / "policies" / "eviction"
    implementation, adaptive, lru, _, _ = _report(copy)
    assert implementation == "mypyc" and not adaptive.endswith(".py") and not lru.endswith(".py")
    assert _report(copy, KVSTORE_PURE_PYTHON="1")[1:3] == (str(folder / "adaptive.py"), str(folder / "lru.py"))
    source = folder / edited
    source.write_text(source.read_text() + "\nEDITED = True\n")
    implementation, adaptive, lru, has_edit, log = _report(copy)
    assert implementation == "python" and (adaptive, lru) == (str(folder / "adaptive.py"), str(folder / "lru.py"))
    assert has_edit == (edited == "adaptive.py")
    assert "eviction policies: pure Python (the mypyc build" in log and "reinstall" in log


def test_an_edit_or_a_renamed_list_changes_the_hash(tmp_path: Path) -> None:
    """The stamp compares the sources and the list of compiled modules."""
    for name in _native.COMPILED + _native.TYPED_BY:
        shutil.copy(_native.HERE / f"{name}.py", tmp_path / f"{name}.py")
    assert _native.source_hash(tmp_path) == _native.source_hash(_native.HERE)
    assert _native.source_hash(tmp_path, _native.COMPILED[:-1]) != _native.source_hash(tmp_path)
    source = tmp_path / "adaptive.py"
    source.write_text(source.read_text().replace("LEAD_Z = ", "LEAD_Z = 0.5 + "))
    assert _native.source_hash(tmp_path) != _native.source_hash(_native.HERE)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_wheel_carries_the_compiled_policies_and_their_stamp(tmp_path: Path) -> None:
    """`pip wheel` with mypyc in the build environment (this one's mypy): every compiled module, mypyc's shared
    library and the stamp, whose hash is that of the sources in the wheel."""
    pytest.importorskip("mypyc")
    copy = copy_sources(tmp_path / "src")
    done = build_wheel(copy, tmp_path / "out")
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "out").glob("kvstore-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    package = "policies/eviction/"
    assert all(any(n.startswith(f"{package}{m}.") and not n.endswith(".py") for n in names) for m in _native.COMPILED)
    assert any(n.startswith(f"{package}_compiled__mypyc.") for n in names)
    stamp = zipfile.ZipFile(wheel).read(f"{package}{_native.STAMP}").decode().strip()
    assert stamp == _native.source_hash(copy / "policies" / "eviction")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_failed_mypyc_build_fails_nothing(tmp_path: Path) -> None:
    """A type error mypyc refuses: the wheel is made, with the pure-Python policies and no stamp."""
    pytest.importorskip("mypyc")
    copy = copy_sources(tmp_path / "src")
    source = copy / "policies" / "eviction" / "_fifo.py"
    source.write_text(source.read_text() + "\nBROKEN: int = 'not an int'\n")
    done = build_wheel(copy, tmp_path / "out")
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "out").glob("kvstore-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "policies/eviction/adaptive.py" in names
    assert not any(n.startswith("policies/eviction/") and n.endswith(".so") for n in names)
    assert f"policies/eviction/{_native.STAMP}" not in names
