"""Which hot eviction policies run compiled: the mypyc build beside the sources, used only while it matches them.

`pip install` (setup.py) compiles the modules named in COMPILED (adaptive with its experts, and lru, arc
and s3fifo so that they compete on equal terms) with mypyc when mypy and a C compiler are in the build
environment, and writes STAMP, the hash of the sources it compiled, beside the extension modules. The
import system prefers an extension module to the `.py` beside it, so `load()` (called by
`policies.eviction` on import, before any policy module is imported) checks the build against the
sources on disk: a fresh build is left to the import system; a stale one (a source edited since the
install, as in an editable install), a partial one, or KVSTORE_PURE_PYTHON=1 gets an import finder that
serves the `.py` files instead. One log line says which implementation is in use and why.

This module imports only the standard library: setup.py loads it by path for COMPILED and `source_hash`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

PACKAGE = "policies.eviction"
# Compiled by mypyc, in import order (adaptive uses _experts and _handover); add or drop a policy by name here.
COMPILED = ["_expert_base", "_fifo", "_expert_hazard", "_expert_hazard_age", "_expert_lru", "_experts", "_handover",
            "lru", "arc", "s3fifo", "adaptive"]
TYPED_BY = ["base", "registry"]  # pure modules whose types the compiled code was built against
GROUP = f"{PACKAGE}._compiled"  # mypyc's shared library: _compiled__mypyc.<suffix> beside the shims
STAMP = "_compiled.sha256"  # written by setup.py after a complete build: source_hash() of what it compiled
HERE = Path(__file__).resolve().parent
IMPLEMENTATION = "python"  # what `load` chose: "mypyc" or "python"


def source_hash(folder: Path = HERE, compiled: Sequence[str] = COMPILED) -> str:
    """sha256 of the names and bytes of the sources a build depends on (COMPILED and TYPED_BY)."""
    digest = hashlib.sha256()
    for name in [*compiled, "", *TYPED_BY]:  # "" separates the lists: moving a module between them is a change
        digest.update(name.encode() + b"\0" + ((folder / f"{name}.py").read_bytes() if name else b"") + b"\0")
    return digest.hexdigest()


def built_modules(folder: Path = HERE) -> list[str]:
    """Modules of `folder` with an extension module beside their `.py` (which the import system would load)."""
    names = set()
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for file in folder.glob(f"*{suffix}"):
            name = file.name.removesuffix(suffix)
            if (folder / f"{name}.py").exists():
                names.add(name)
    return sorted(names)


def build_state(folder: Path = HERE) -> str:
    """The build in `folder`: "fresh" (a complete build of the sources now there), "stale" (a build of other
    sources, or part of one) or "none" (nothing built)."""
    stamp = folder / STAMP
    built = built_modules(folder)
    if not built and not stamp.exists():
        return "none"
    if stamp.exists() and stamp.read_text().strip() == source_hash(folder) and built == sorted(COMPILED):
        return "fresh"
    return "stale"


class SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the named modules' `.py` files, passing over the extension modules beside them; None for others."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        file = self.files.get(fullname)
        return importlib.util.spec_from_file_location(fullname, file) if file is not None else None


def _serve_sources() -> None:
    """Import every built module of this package from its `.py` (ahead of the path finder, which prefers the build)."""
    files = {f"{PACKAGE}.{name}": HERE / f"{name}.py" for name in built_modules()}
    if files and not any(isinstance(finder, SourceFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, SourceFinder(files))


def load() -> str:
    """Use the build beside the sources if it is fresh, else the `.py` files; returns (and logs) the implementation."""
    global IMPLEMENTATION
    if os.environ.get("KVSTORE_PURE_PYTHON", "") not in ("", "0"):
        _serve_sources()
        logger.info("eviction policies: pure Python (KVSTORE_PURE_PYTHON is set)")
        return IMPLEMENTATION
    state = build_state()
    if state == "none":
        logger.info("eviction policies: pure Python (no mypyc build in %s: `pip install` makes one when mypy and "
                    "a C compiler are in its build environment)", HERE)
        return IMPLEMENTATION
    if state == "stale":
        _serve_sources()
        logger.warning("eviction policies: pure Python (the mypyc build in %s is not of these sources: edited or "
                       "partly built since the install; reinstall to rebuild: `bash scripts/setup.sh` or "
                       "`pip install -e .`)", HERE)
        return IMPLEMENTATION
    try:
        importlib.import_module(f"{GROUP}__mypyc")  # the shared library every compiled module loads first
    except ImportError as exc:  # built for another libc or damaged: the sources still work
        _serve_sources()
        logger.warning("eviction policies: pure Python (the mypyc build in %s does not load: %s)", HERE, exc)
        return IMPLEMENTATION
    IMPLEMENTATION = "mypyc"
    logger.info("eviction policies: compiled with mypyc (%s)", HERE)
    return IMPLEMENTATION
