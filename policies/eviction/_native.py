"""Optional mypyc build of the replay-hot eviction policies (adaptive with its experts, and LRU, ARC,
S3-FIFO so that they compete on equal terms); pure Python whenever no fresh build exists.

    python -m policies.eviction.build_native    # scripts/setup.sh runs it; needs mypy and a C compiler

The build goes to a cache folder named by a hash of the compiled sources (and of the modules whose
types they use), the Python version and the mypy version, never next to the sources: an edited `.py`
has another hash, so a build made before the edit is never loaded (no stale `.so` shadows a source).
`load()` (called by `policies.eviction` on import) installs an import finder that serves a fresh
build's extension modules in place of the pure ones (the import system then loads each on first use,
as it would a source file), and logs one line saying which implementation is in use.
KVSTORE_PURE_PYTHON=1 forces pure Python; KVSTORE_NATIVE_CACHE moves the cache folder.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

PACKAGE = "policies.eviction"
COMPILED = ("_expert_base", "_fifo", "_expert_hazard", "_expert_hazard_age", "_expert_lru", "_experts", "_handover",
            "lru", "arc", "s3fifo", "adaptive")  # in import order (adaptive uses _experts and _handover)
TYPED_BY = ("base", "registry")  # pure modules whose types the compiled code was built against
GROUP = "kvstore_eviction_native"
HERE = Path(__file__).resolve().parent
IMPLEMENTATION = "python"  # what `load` chose: "mypyc" or "python"


def _mypy_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mypy")
    except PackageNotFoundError:  # PackageNotFoundError: no mypy, nothing can be built; the key only has to differ
        return "none"


def build_key(folder: Path = HERE, mypy_version: str | None = None) -> str:
    """Hash of the sources a build depends on, the interpreter and mypy: the build's folder name."""
    digest = hashlib.sha256()
    for name in COMPILED + TYPED_BY:
        digest.update(name.encode() + b"\0" + (folder / f"{name}.py").read_bytes() + b"\0")
    digest.update(f"{sys.implementation.cache_tag} {mypy_version or _mypy_version()}".encode())
    return digest.hexdigest()[:24]


def cache_dir() -> Path:
    """$KVSTORE_NATIVE_CACHE/KEY, else native/KEY under the user's cache directory (platformdirs), never the sources."""
    import platformdirs

    root = os.environ.get("KVSTORE_NATIVE_CACHE") or Path(platformdirs.user_cache_dir("kvstore")) / "native"
    return Path(root) / build_key()


def _suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def _built_files(folder: Path) -> list[tuple[str, Path]]:
    """(module name, file) of a build, the group library first; missing files are listed too."""
    files = [(f"{GROUP}__mypyc", folder / f"{GROUP}__mypyc{_suffix()}")]
    files += [(f"{PACKAGE}.{m}", folder.joinpath(*PACKAGE.split("."), m + _suffix())) for m in COMPILED]
    return files


class NativeFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules of one build (and its group library) by name; None for any other."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        file = self.files.get(fullname)
        return importlib.util.spec_from_file_location(fullname, file) if file is not None else None


def load() -> str:
    """Use a fresh build if there is one; returns (and logs) the implementation in use."""
    global IMPLEMENTATION
    if os.environ.get("KVSTORE_PURE_PYTHON", "") not in ("", "0"):
        logger.info("eviction policies: pure Python (KVSTORE_PURE_PYTHON is set)")
        return IMPLEMENTATION
    folder = cache_dir()
    files = _built_files(folder)
    if not all(path.exists() for _, path in files):
        logger.info("eviction policies: pure Python (no mypyc build for these sources in %s; "
                    "run `python -m policies.eviction.build_native`)", folder.parent)
        return IMPLEMENTATION
    if any(name in sys.modules for name, _ in files[1:]):  # too late: the pure ones are in use
        logger.warning("eviction policies: pure Python (imported before the mypyc build could load)")
        return IMPLEMENTATION
    if not any(isinstance(finder, NativeFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, NativeFinder(dict(files)))  # ahead of the path finder that finds the .py files
    IMPLEMENTATION = "mypyc"
    logger.info("eviction policies: compiled with mypyc (%s)", folder)
    return IMPLEMENTATION


_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
paths, target, lib, tmp, group = sys.argv[1].split(","), *sys.argv[2:6]
setup(name="kvstore_eviction_native", script_args=["-q", "build_ext", "--build-lib", lib, "--build-temp", tmp],
      ext_modules=mypycify(paths, target_dir=target, group_name=group))
"""


def build(*, quiet: bool = True) -> Path:
    """Compile the policies into `cache_dir()` (nothing to do when it exists); returns the folder.

    Raises:
        RuntimeError: mypyc or the C compiler failed (its output is in the message); pure Python stays.
    """
    folder = cache_dir()
    if all(path.exists() for _, path in _built_files(folder)):
        return folder
    work = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    paths = ",".join(str(Path(*PACKAGE.split("."), f"{m}.py")) for m in COMPILED)
    command = [sys.executable, "-c", _SETUP, paths, str(work / "c"), str(work / "lib"), str(work / "obj"), GROUP]
    env = {**os.environ, "MYPY_CACHE_DIR": str(work / "mypy_cache")}  # mypy's cache beside the build, not in the sources
    done = subprocess.run(command, cwd=HERE.parents[1], capture_output=quiet, text=True, check=False, env=env)
    if done.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(f"mypyc build failed (exit {done.returncode}); pure Python stays in use:\n"
                           f"{(done.stdout or '')[-2000:]}{(done.stderr or '')[-4000:]}")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(work / "lib", folder)  # atomic: a reader sees the whole build or none
    shutil.rmtree(work, ignore_errors=True)
    return folder

