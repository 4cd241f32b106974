"""The C build of the chunk-key loops (kvstore/csrc/chunk_keys.c, built by setup.py as `pip install` does) against
its pure-Python twin in kvstore/hashing.py: the same int32 bytes, the same keys, the same rejections; pure Python,
said so in the log, without a build, with a build of other sources (an edited csrc/), or when a compile fails."""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from kvstore import hashing, native_keys
from kvstore.errors import BadChunkError
from kvstore.hashing import Namespace
from tests.helpers.source_copy import build_wheel, copy_sources, run_in

ROOT = Namespace(model_id="m", layout_fingerprint=1).root_key
EDGES = [0, 1, 2**30 - 1, 2**30, 2**31 - 1]  # 2**30 is the first id CPython stores in two digits
REPORT = "from kvstore import hashing; print(hashing.keys_implementation())"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kvstore/_chunk_keys built by setup.py beside a temporary copy of the sources (as an editable install does)."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler: the C build cannot be made here (pure Python runs)")
    copy = copy_sources(tmp_path_factory.mktemp("src"))
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=copy, capture_output=True,
                          text=True, timeout=600, check=False, env={**os.environ, "KVSTORE_MYPYC": "0"})
    files = list((copy / "kvstore").glob("_chunk_keys.*"))
    assert done.returncode == 0 and len(files) == 1, done.stderr[-3000:]
    return files[0]


@pytest.fixture(scope="module")
def native(built: Path) -> ModuleType:
    """That build, loaded; it carries the hash of the sources it was compiled from."""
    spec = importlib.util.spec_from_file_location(native_keys.MODULE, built)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.SOURCE_HASH == native_keys.source_hash()
    return module


def _outcome(tokens: object, chunk_tokens: int) -> object:
    """chunk_keys' answer, or the type of what it raised."""
    try:
        return hashing.chunk_keys(tokens, ROOT, chunk_tokens)  # type: ignore[arg-type]
    except Exception as exc:  # the type is the answer compared
        return type(exc)


def _both(monkeypatch: pytest.MonkeyPatch, native: ModuleType, tokens: object, chunk_tokens: int) -> tuple[object, object]:
    monkeypatch.setattr(hashing, "_NATIVE", native)
    compiled = _outcome(tokens, chunk_tokens)
    monkeypatch.setattr(hashing, "_NATIVE", None)
    return compiled, _outcome(tokens, chunk_tokens)


def test_packing_gives_the_int32_bytes_of_every_id(native: ModuleType) -> None:
    tokens = EDGES + random.Random(1).choices(range(2**31), k=4096)
    packed = np.frombuffer(native.pack_int32(tokens), dtype="<i4")
    assert packed.tolist() == tokens
    assert bytes(native.pack_int32(tuple(tokens))) == np.array(tokens, dtype="<i4").tobytes()
    assert bytes(native.pack_int32([True, False])) == np.array([1, 0], dtype="<i4").tobytes()


@pytest.mark.parametrize("chunk_tokens", [1, 3, 256])
def test_keys_are_byte_identical_to_the_pure_python_chain(native: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                          chunk_tokens: int) -> None:
    tokens = EDGES * 50 + random.Random(chunk_tokens).choices(range(128_000), k=2000)  # a tail that fills no chunk
    compiled, pure = _both(monkeypatch, native, tokens, chunk_tokens)
    assert compiled == pure and isinstance(pure, list) and len(pure) == len(tokens) // chunk_tokens
    compiled_array, pure_array = _both(monkeypatch, native, np.array(tokens, dtype=np.int32), chunk_tokens)
    assert compiled_array == pure_array == pure


@pytest.mark.parametrize("tokens", [[-1], [5, -2**40], [2**31], [1, 2**70], [0.5], ["a"], [[1, 2]], [None],
                                    [np.int64(3), 4], [np.int64(-3)], [], [True, 2**31 - 1]])
def test_rejected_and_accepted_alike(native: ModuleType, monkeypatch: pytest.MonkeyPatch, tokens: list[object]) -> None:
    """Negative, oversized and non-int ids raise BadChunkError on both paths; numpy ints and bools are taken
    by both (the C loop hands an item that is not an int to the pure path)."""
    compiled, pure = _both(monkeypatch, native, tokens, 1)
    assert compiled == pure
    if any(isinstance(t, int) and not 0 <= t < 2**31 for t in tokens) or any(isinstance(t, (float, str, list))
                                                                           or t is None for t in tokens):
        assert pure is BadChunkError


def test_an_oversized_id_is_named_with_its_place(native: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "_NATIVE", native)
    with pytest.raises(BadChunkError, match=r"\[0, 2\*\*31\): item 2 is 2147483648"):
        hashing.chunk_keys([1, 2, 2**31], ROOT, 1)


def test_without_a_build_the_pure_path_runs_and_the_log_says_so(tmp_path: Path) -> None:
    done = run_in(copy_sources(tmp_path), REPORT, KVSTORE_PURE_PYTHON="")
    assert done.stdout.strip() == "python"
    assert "chunk keys: pure Python (no C build" in done.stderr


def test_a_build_of_other_sources_is_refused(built: Path, tmp_path: Path) -> None:
    """Regression guard for stale builds: an editable install keeps its build beside the sources; once csrc/ is
    edited, that build no longer matches and the pure Python runs (and says why) until a reinstall rebuilds it."""
    copy = copy_sources(tmp_path)
    shutil.copy2(built, copy / "kvstore" / built.name)
    fresh = run_in(copy, REPORT, KVSTORE_PURE_PYTHON="")
    assert fresh.stdout.strip() == "C" and "chunk keys: compiled C" in fresh.stderr
    assert run_in(copy, REPORT, KVSTORE_PURE_PYTHON="1").stdout.strip() == "python"
    source = copy / "kvstore" / "csrc" / "chunk_keys.c"
    source.write_text(source.read_text() + "/* edited after the build */\n")
    stale = run_in(copy, REPORT, KVSTORE_PURE_PYTHON="")
    assert stale.stdout.strip() == "python"
    assert "chunk keys: pure Python (the C build" in stale.stderr and "reinstall" in stale.stderr


def test_a_failed_compile_fails_nothing(tmp_path: Path) -> None:
    """`pip wheel` of sources whose C does not compile: the wheel is made, without the C module (pure Python)."""
    copy = copy_sources(tmp_path / "src")
    source = copy / "kvstore" / "csrc" / "chunk_keys.c"
    source.write_text(source.read_text() + "\n#error this build is meant to fail\n")
    done = build_wheel(copy, tmp_path / "out", KVSTORE_MYPYC="0")
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "out").glob("kvstore-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "kvstore/hashing.py" in names and not any(name.startswith("kvstore/_chunk_keys") for name in names)


def _hasher_outcome(pieces: list[object], chunk_tokens: int) -> object:
    """A ChunkHasher fed `pieces` one by one: its keys, what each extend returned and its tail; or the error type."""
    hasher = hashing.ChunkHasher(ROOT, chunk_tokens)
    try:
        returned = [hasher.extend(piece) for piece in pieces]  # type: ignore[arg-type]
    except Exception as exc:  # the type is the answer compared
        return type(exc)
    return hasher.keys, returned, hasher.num_tokens, hasher.tail_key()


@pytest.mark.parametrize("chunk_tokens", [1, 7, 256])
def test_a_growing_list_keys_as_in_pure_python(native: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                               chunk_tokens: int) -> None:
    """The one-pass list path (packing and hashing together, the pending ids first) gives a growing request's
    keys, tail and counts byte for byte as the pure path, with lists, tuples and arrays mixed as engines send
    them: a prompt, then generated tokens a few at a time."""
    rng = random.Random(chunk_tokens)
    tokens = EDGES + rng.choices(range(128_000), k=3 * 256 + 5)
    cuts = sorted(rng.sample(range(1, len(tokens)), 12))
    pieces: list[object] = [tokens[a:b] for a, b in zip([0, *cuts], [*cuts, len(tokens)], strict=True)]
    pieces[3] = tuple(pieces[3])  # type: ignore[arg-type]
    pieces[5] = np.array(pieces[5], dtype=np.int64)
    pieces.insert(2, [])
    monkeypatch.setattr(hashing, "_NATIVE", native)
    compiled = _hasher_outcome(pieces, chunk_tokens)
    monkeypatch.setattr(hashing, "_NATIVE", None)
    pure = _hasher_outcome(pieces, chunk_tokens)
    assert compiled == pure and isinstance(pure, tuple)
    assert pure[0] == hashing.chunk_keys(tokens, ROOT, chunk_tokens) and pure[2] == len(tokens)


@pytest.mark.parametrize("bad", [[3, -1], [3, 2**31], [3, 0.5], [3, None], [np.int64(-3)]])
def test_a_bad_id_in_a_growing_list_is_refused_alike(native: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                     bad: list[object]) -> None:
    """A bad id after pending ids: BadChunkError on both paths, and the hasher keeps what it had."""
    monkeypatch.setattr(hashing, "_NATIVE", native)
    hasher = hashing.ChunkHasher(ROOT, 4)
    hasher.extend([1, 2, 3, 4, 5])
    before = (list(hasher.keys), hasher.num_tokens, hasher.tail_key())
    with pytest.raises(BadChunkError):
        hasher.extend(bad)  # type: ignore[arg-type]
    assert (hasher.keys, hasher.num_tokens, hasher.tail_key()) == before
    monkeypatch.setattr(hashing, "_NATIVE", None)
    assert _hasher_outcome([[1, 2, 3, 4, 5], bad], 4) is BadChunkError
