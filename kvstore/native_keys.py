"""Which chunk-key loops run: the C build `pip install` made (kvstore._chunk_keys), used only while it matches its sources.

Why C: a first lookup of a 128k-token prompt held as a Python list spent ~90% of its time turning the list
into int32 (marshal, then numpy) and the rest in a Python loop of 512 xxh3 calls; in C both are one pass
(`kvstore bench lookup`). setup.py compiles csrc/chunk_keys.c (with vendor/xxhash.h) as an optional extension: a
failed compile leaves kvstore/hashing.py's pure Python in use, the same keys. The build carries
SOURCE_HASH, `source_hash()` of the sources it was compiled from; `load()` refuses a build whose hash
differs from the sources now installed (an edited csrc/ in an editable install) and logs one line saying
which implementation is in use and why. KVSTORE_PURE_PYTHON=1 forces pure Python.

This module imports only the standard library: setup.py loads it by path for FILES and `source_hash`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

SOURCES = Path(__file__).resolve().parent / "csrc"
FILES = ("chunk_keys.c", "key_index.c", "vendor/xxhash.h")  # the .c files are compiled; the hash covers all
MODULE = "kvstore._chunk_keys"


def source_hash(folder: Path = SOURCES) -> str:
    """sha256 of the names and bytes of the C sources."""
    digest = hashlib.sha256()
    for name in FILES:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return digest.hexdigest()


def built_file(folder: Path = SOURCES.parent) -> Path | None:
    """The extension module `pip install` left in `folder` (the package beside csrc/), None when there is none.
    Looked for by path, not imported by name: an editable install's finder would map the name to its own
    checkout, whose build may be of other sources than these."""
    name = MODULE.rpartition(".")[2]
    return next((folder / f"{name}{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES
                 if (folder / f"{name}{suffix}").exists()), None)


def _import(file: Path) -> ModuleType:
    module = sys.modules.get(MODULE)
    if module is not None and module.__file__ == str(file):
        return module
    spec = importlib.util.spec_from_file_location(MODULE, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"{file} is not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[MODULE] = module
    return module


def build_state() -> str:
    """The installed build: "fresh" (of the sources now in csrc/), "stale" (of other sources) or "none"."""
    file = built_file()
    if file is None:
        return "none"
    try:
        module = _import(file)
    except ImportError:
        return "none"
    return "fresh" if module.SOURCE_HASH == source_hash() else "stale"


def load() -> ModuleType | None:
    """The compiled module when it was built from the sources now installed (and pure Python is not forced)."""
    if os.environ.get("KVSTORE_PURE_PYTHON", "") not in ("", "0"):
        logger.info("chunk keys: pure Python (KVSTORE_PURE_PYTHON is set)")
        return None
    file = built_file()
    if file is None:  # not built (no C compiler at install)
        logger.info("chunk keys: pure Python (no C build in %s; `pip install` compiles one when a C compiler is there)",
                    SOURCES.parent)
        return None
    try:
        module = _import(file)
    except ImportError as exc:  # built for another libc or Python
        logger.info("chunk keys: pure Python (the C build %s does not load: %s; reinstall to rebuild)", file, exc)
        return None
    if module.SOURCE_HASH != source_hash():
        logger.warning("chunk keys: pure Python (the C build %s is not of the sources in %s: edited since the "
                       "install; reinstall to rebuild: `bash scripts/setup.sh` or `pip install -e .`)",
                       module.__file__, SOURCES)
        return None
    logger.info("chunk keys: compiled C (%s)", module.__file__)
    return module


@functools.cache
def loaded() -> ModuleType | None:
    """`load()` once per process (one log line): the chunk-key loops (kvstore/hashing.py) and the store index's
    KeyIndex (kvstore/store/index.py) share the build."""
    return load()
