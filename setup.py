"""kvstore's compiled parts, built by `pip install`: the chunk-key loops in C and the hot eviction policies with mypyc.

Both are optional: a failed compile (no C compiler, no mypy in the build environment, a mypyc error) leaves the
pure Python in use and fails nothing. Each build is stamped with the hash of the sources it was made from
(kvstore._chunk_keys.SOURCE_HASH; policies/eviction/_compiled.sha256), and kvstore/native_keys.py and
policies/eviction/_native.py refuse a build that does not match the sources beside it, so an edited `.py` of
an editable install is never shadowed by an old `.so`. KVSTORE_MYPYC=0 skips the mypyc build (a faster
install, pure-Python policies). The rest of the metadata is in pyproject.toml; docs/native_build.md explains.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent  # the build runs here (pip and `python setup.py` both): sources are relative


def _load(path: str) -> ModuleType:
    """A standard-library-only module of kvstore, by file: importing its package would need kvstore's dependencies."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KEYS = _load("kvstore/native_keys.py")
POLICIES = _load("policies/eviction/_native.py")


def _say(message: str) -> None:
    print(f"kvstore build: {message}", file=sys.stderr)  # pip shows it with -v; the import-time log line says the rest


def chunk_keys_extension() -> Extension:
    """kvstore._chunk_keys from csrc/chunk_keys.c and key_index.c, carrying the hash of its sources."""
    return Extension("kvstore._chunk_keys", sources=["kvstore/csrc/chunk_keys.c", "kvstore/csrc/key_index.c"],
                     depends=["kvstore/csrc/vendor/xxhash.h"],
                     define_macros=[("KVSTORE_SOURCE_HASH", f'"{KEYS.source_hash()}"')], extra_compile_args=["-O3"])


def mypyc_extensions() -> list[Extension]:
    """The shared library and one shim per module of POLICIES.COMPILED; none when mypyc is absent, off or fails."""
    if os.environ.get("KVSTORE_MYPYC", "") == "0":
        _say("KVSTORE_MYPYC=0: the eviction policies are not compiled (pure Python)")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("no mypyc in the build environment: the eviction policies stay pure Python")
        return []
    files = [f"{POLICIES.PACKAGE.replace('.', '/')}/{name}.py" for name in POLICIES.COMPILED]
    try:  # mypy's cache and mypyc's C go under build/ (git-ignored), never beside the sources
        return list(mypycify(["--cache-dir", "build/mypyc/cache", *files], target_dir="build/mypyc",
                             group_name=POLICIES.GROUP))
    except (Exception, SystemExit) as exc:  # a type error exits: the install goes on without the compiled policies
        _say(f"mypyc failed ({exc}): the eviction policies stay pure Python")
        return []


METADATA_ONLY = {"egg_info", "dist_info", "sdist"}  # commands that list sources but build nothing


@functools.cache
def mypyc_build() -> tuple[str, list[Extension]]:
    """The hash of the policies' sources, then mypyc's extensions of them: once per process."""
    return POLICIES.source_hash(), mypyc_extensions()


class BuildNative(build_ext):
    """build_ext where a failed compile fails nothing: the module stays pure Python, a failed piece of the mypyc
    build drops the whole of it, and a complete mypyc build gets its stamp (the hash of its sources). mypyc runs
    only when the extensions are built, not when setup.py is read (pip reads it three times per install)."""

    def finalize_options(self) -> None:
        # egg_info and sdist finalize this command too, for its source list (pip runs them for the metadata):
        # mypyc, a minute or more, runs only in a process that builds
        building = not set(self.distribution.commands) <= METADATA_ONLY
        self.mypyc_hash, mypyc = mypyc_build() if building else ("", [])
        known = {ext.name for ext in self.distribution.ext_modules or []}
        self.distribution.ext_modules = [*(self.distribution.ext_modules or []),
                                         *(ext for ext in mypyc if ext.name not in known)]
        self.mypyc_names = frozenset(ext.name for ext in mypyc)
        super().finalize_options()
        # one compile per core: mypyc writes a C file per module besides its shared library
        self.parallel = self.parallel or os.cpu_count() or 1  # type: ignore[has-type]  # distutils leaves it untyped

    def run(self) -> None:
        self.failed: set[str] = set()
        stamps = self._package_files(POLICIES.PACKAGE, POLICIES.STAMP)
        if self.mypyc_names:  # only a build that compiles the policies touches their stamp (another may have made it)
            for path in stamps:
                Path(path).unlink(missing_ok=True)
        super().run()
        dropped = self.failed | (self.mypyc_names if self.failed & self.mypyc_names else set())
        for name in sorted(dropped):
            package = name.rpartition(".")[0]
            for path in self._package_files(package, Path(self.get_ext_filename(name)).name):
                Path(path).unlink(missing_ok=True)
        if self.mypyc_names and not dropped & self.mypyc_names:
            for path in stamps:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(self.mypyc_hash + "\n")
            _say(f"eviction policies compiled with mypyc: {', '.join(POLICIES.COMPILED)}")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # any failure, the compiler's or not: the pure Python stays in use
            self.failed.add(ext.name)
            _say(f"{ext.name} not built, its pure Python stays in use: {exc}")

    def _package_files(self, package: str, filename: str) -> list[str]:
        """Where `filename` of `package` goes: the build folder, and the sources too when building in place."""
        paths = [os.path.join(self.build_lib, *package.split("."), filename)]
        if self.inplace:
            paths.append(os.path.join(self.get_finalized_command("build_py").get_package_dir(package), filename))
        return paths


setup(ext_modules=[chunk_keys_extension()], cmdclass={"build_ext": BuildNative})
