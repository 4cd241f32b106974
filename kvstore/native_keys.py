"""Optional C build of the chunk-key loops (kvstore/csrc/chunk_keys.c); kvstore/hashing.py's pure Python otherwise.

    python -m kvstore.native_keys    # scripts/setup.sh runs it; needs a C compiler and Python's headers

Why C: a first lookup of a 128k-token prompt held as a Python list spent ~90% of its time turning the list
into int32 (marshal, then numpy) and the rest in a Python loop of 512 xxh3 calls; in C both are one pass
(`kvstore bench lookup`). The build goes to a cache folder named by a hash of the C sources and the
interpreter (never next to the sources), so an edited source is never served by an old build. `load()`
logs one line saying which implementation is in use; KVSTORE_PURE_PYTHON=1 forces pure Python and
KVSTORE_NATIVE_CACHE moves the cache folder (both as for the eviction policies' mypyc build).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

SOURCES = Path(__file__).resolve().parent / "csrc"
FILES = ("chunk_keys.c", "xxhash.h")
MODULE = "kvstore._chunk_keys"


def build_key() -> str:
    """Hash of the C sources and the interpreter: the build's folder name."""
    digest = hashlib.sha256()
    for name in FILES:
        digest.update(name.encode() + b"\0" + (SOURCES / name).read_bytes() + b"\0")
    digest.update(sys.implementation.cache_tag.encode())
    return "keys-" + digest.hexdigest()[:24]


def cache_dir() -> Path:
    """$KVSTORE_NATIVE_CACHE/KEY, else native/KEY under the user's cache directory (platformdirs)."""
    import platformdirs

    root = os.environ.get("KVSTORE_NATIVE_CACHE") or Path(platformdirs.user_cache_dir("kvstore")) / "native"
    return Path(root) / build_key()


def built_file(folder: Path) -> Path:
    return folder / f"_chunk_keys{importlib.machinery.EXTENSION_SUFFIXES[0]}"


def load() -> ModuleType | None:
    """The compiled module when a build of these sources exists (and pure Python is not forced), else None."""
    if os.environ.get("KVSTORE_PURE_PYTHON", "") not in ("", "0"):
        logger.info("chunk keys: pure Python (KVSTORE_PURE_PYTHON is set)")
        return None
    path = built_file(cache_dir())
    if not path.exists():
        logger.info("chunk keys: pure Python (no C build of these sources in %s; run `python -m kvstore.native_keys`)",
                    path.parent.parent)
        return None
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        logger.warning("chunk keys: pure Python (%s is not a loadable extension)", path)
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:  # a build for another libc or a damaged file: pure Python still works
        logger.warning("chunk keys: pure Python (%s does not load: %s)", path, exc)
        return None
    logger.info("chunk keys: compiled C (%s)", path.parent)
    return module


_SETUP = """
import sys
from setuptools import Extension, setup
source, lib, tmp = sys.argv[1:4]
setup(name="kvstore_chunk_keys", script_args=["-q", "build_ext", "--build-lib", lib, "--build-temp", tmp],
      ext_modules=[Extension("_chunk_keys", [source], extra_compile_args=["-O3"])])
"""


def build(*, quiet: bool = True) -> Path:
    """Compile kvstore/csrc/chunk_keys.c into `cache_dir()` (nothing to do when it is there); returns the folder.

    Raises:
        RuntimeError: the C compiler failed (its output is in the message); pure Python stays in use.
    """
    folder = cache_dir()
    if built_file(folder).exists():
        return folder
    work = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    command = [sys.executable, "-c", _SETUP, str(SOURCES / FILES[0]), str(work / "lib"), str(work / "obj")]
    done = subprocess.run(command, cwd=SOURCES, capture_output=quiet, text=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(f"C build of the chunk keys failed (exit {done.returncode}); pure Python stays in use:\n"
                           f"{(done.stdout or '')[-2000:]}{(done.stderr or '')[-4000:]}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(work / "lib", folder)  # atomic: a reader sees the whole build or none
    shutil.rmtree(work, ignore_errors=True)
    return folder


def main() -> int:
    try:
        print(f"chunk keys compiled in {build()}")
    except (RuntimeError, OSError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
