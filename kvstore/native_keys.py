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

import hashlib
import importlib
import logging
import os
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

SOURCES = Path(__file__).resolve().parent / "csrc"
FILES = ("chunk_keys.c", "vendor/xxhash.h")  # the first is compiled; the hash covers all
MODULE = "kvstore._chunk_keys"


def source_hash(folder: Path = SOURCES) -> str:
    """sha256 of the names and bytes of the C sources."""
    digest = hashlib.sha256()
    for name in FILES:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return digest.hexdigest()


def build_state() -> str:
    """The installed build: "fresh" (of the sources now in csrc/), "stale" (of other sources) or "none"."""
    try:
        module = importlib.import_module(MODULE)
    except ImportError:
        return "none"
    return "fresh" if module.SOURCE_HASH == source_hash() else "stale"


def load() -> ModuleType | None:
    """The compiled module when it was built from the sources now installed (and pure Python is not forced)."""
    if os.environ.get("KVSTORE_PURE_PYTHON", "") not in ("", "0"):
        logger.info("chunk keys: pure Python (KVSTORE_PURE_PYTHON is set)")
        return None
    try:
        module = importlib.import_module(MODULE)
    except ImportError as exc:  # not built (no C compiler at install), or built for another libc
        logger.info("chunk keys: pure Python (no C build: %s; `pip install` compiles one when a C compiler is there)",
                    exc)
        return None
    if module.SOURCE_HASH != source_hash():
        logger.warning("chunk keys: pure Python (the C build %s is not of the sources in %s: edited since the "
                       "install; reinstall to rebuild: `bash scripts/setup.sh` or `pip install -e .`)",
                       module.__file__, SOURCES)
        return None
    logger.info("chunk keys: compiled C (%s)", module.__file__)
    return module
