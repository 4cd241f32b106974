"""libzstd through ctypes for the `zstd` codec's planes: the fast strategy with its match search accelerated
and Huffman-coded literals kept on, the two settings python-zstandard cannot set.

Why: on a byte plane of exponents the gain is entropy coding, not matches (the engine model's top plane:
order-0 entropy 2.62 bits a byte, zstd's ratio 2.98 with or without a match search). Zstandard's
acceleration (`ZSTD_c_targetLength` on the fast strategy) skips most of the match search, but then turns
literal compression off unless `ZSTD_c_literalCompressionMode` (an experimental parameter) forces it on.
With both the plane codes in about 0.75x the CPU time for a slightly better ratio, and the frame is a
standard zstd frame: any decoder reads it, so the payload format does not change.

The library is the system's libzstd (found by `ctypes.util.find_library`); ctypes releases the GIL around
each call, so pieces code in parallel. Where it is missing, older than 1.4 or fails its self-test at load,
`load()` returns None and the codec keeps python-zstandard's fast strategy (logged once).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import threading
from typing import Protocol

import numpy as np
import zstandard

logger = logging.getLogger(__name__)

ACCELERATION = 128  # ZSTD_c_targetLength on the fast strategy: after a miss, skip ahead about this far
MIN_VERSION = 10400  # the first release with ZSTD_c_literalCompressionMode
# zstd.h's parameter numbers (stable since 1.4; the experimental one is checked by the self-test)
_WINDOW_LOG, _HASH_LOG, _CHAIN_LOG, _SEARCH_LOG, _MIN_MATCH, _TARGET_LENGTH, _STRATEGY = range(101, 108)
_CONTENT_SIZE_FLAG, _LITERAL_COMPRESSION_MODE = 200, 1002
_STRATEGY_FAST, _PS_ENABLE = 1, 1


class NativeCompressor:
    """One thread's libzstd compression context with the codec's settings (contexts are not thread-safe)."""

    def __init__(self, lib: ctypes.CDLL, settings: tuple[int, int, int]) -> None:
        self._lib = lib
        self._cctx: int | None = lib.ZSTD_createCCtx()
        if not self._cctx:
            raise MemoryError("ZSTD_createCCtx returned NULL")
        window_log, hash_log, min_match = settings
        for param, value in ((_STRATEGY, _STRATEGY_FAST), (_WINDOW_LOG, window_log), (_HASH_LOG, hash_log),
                             (_CHAIN_LOG, 6), (_SEARCH_LOG, 1), (_MIN_MATCH, min_match),
                             (_TARGET_LENGTH, ACCELERATION), (_LITERAL_COMPRESSION_MODE, _PS_ENABLE),
                             (_CONTENT_SIZE_FLAG, 1)):
            code = lib.ZSTD_CCtx_setParameter(self._cctx, param, value)
            if lib.ZSTD_isError(code):
                raise ValueError(f"libzstd refused parameter {param} = {value}: {_error_name(lib, code)}")

    def __del__(self) -> None:
        if self._cctx:
            self._lib.ZSTD_freeCCtx(self._cctx)
            self._cctx = None

    def compress_into(self, src: np.ndarray, dst: np.ndarray) -> int:
        """Compress contiguous uint8 `src` into `dst` as one zstd frame; its length, or 0 when it does not fit."""
        code = self._lib.ZSTD_compress2(self._cctx, dst.ctypes.data, dst.nbytes, src.ctypes.data, src.nbytes)
        if self._lib.ZSTD_isError(code):
            return 0  # dstSize_tooSmall: the frame would not shrink the plane; the caller stores it raw
        return int(code)


def _error_name(lib: ctypes.CDLL, code: int) -> str:
    return bytes(lib.ZSTD_getErrorName(code)).decode(errors="replace")


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    size_t, ptr = ctypes.c_size_t, ctypes.c_void_p
    signatures: dict[str, tuple[list[type], type]] = {
        "ZSTD_versionNumber": ([], ctypes.c_uint),
        "ZSTD_createCCtx": ([], ptr),
        "ZSTD_freeCCtx": ([ptr], size_t),
        "ZSTD_CCtx_setParameter": ([ptr, ctypes.c_int, ctypes.c_int], size_t),
        "ZSTD_compress2": ([ptr, ptr, size_t, ptr, size_t], size_t),
        "ZSTD_isError": ([size_t], ctypes.c_uint),
        "ZSTD_getErrorName": ([size_t], ctypes.c_char_p),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name)  # AttributeError: not a libzstd (caught by load)
        function.argtypes, function.restype = argtypes, restype
    return lib


@functools.cache
def load() -> ctypes.CDLL | None:
    """The system's libzstd, bound and self-tested, or None (then the codec uses python-zstandard)."""
    path = ctypes.util.find_library("zstd")
    try:
        if path is None:
            raise OSError("no libzstd found on the library path")
        lib = _bind(ctypes.CDLL(path))
        version = int(lib.ZSTD_versionNumber())
        if version < MIN_VERSION:
            raise OSError(f"libzstd {version} is older than {MIN_VERSION}")
        _self_test(lib)
    except (OSError, AttributeError, ValueError) as exc:
        logger.warning("libzstd unavailable for the zstd codec (%s): it codes with python-zstandard's fast "
                       "strategy (about 1.3x the CPU time, install libzstd1 for the faster path)", exc)
        return None
    logger.info("zstd codec: libzstd %s at %s, accelerated fast strategy with Huffman literals", version, path)
    return lib


def _self_test(lib: ctypes.CDLL) -> None:
    """A skewed sample must shrink under the settings and come back through python-zstandard's decoder."""
    sample = np.random.default_rng(0).geometric(0.3, 1 << 16).clip(0, 255).astype(np.uint8)
    dst = np.empty(sample.nbytes, dtype=np.uint8)
    size = NativeCompressor(lib, (17, 7, 7)).compress_into(sample, dst)
    if not 0 < size < sample.nbytes // 2:
        raise ValueError(f"the self-test sample coded to {size} of {sample.nbytes} bytes: literals not coded")
    back = zstandard.ZstdDecompressor().decompress(dst[:size].tobytes(), max_output_size=sample.nbytes)
    if back != sample.tobytes():
        raise ValueError("the self-test frame decoded to other bytes")


class StandardCompressor:
    """python-zstandard's fast strategy with the codec's settings, where libzstd cannot be loaded (literals are
    Huffman-coded there only without acceleration, so its match search runs on every position)."""

    def __init__(self, settings: tuple[int, int, int]) -> None:
        window_log, hash_log, min_match = settings
        self._cctx = zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters(
            window_log=window_log, hash_log=hash_log, chain_log=6, search_log=1, min_match=min_match,
            target_length=0, strategy=zstandard.STRATEGY_FAST))

    def compress_into(self, src: np.ndarray, dst: np.ndarray) -> int:
        frame = self._cctx.compress(src.data)
        if len(frame) > dst.nbytes:
            return 0
        dst[: len(frame)] = np.frombuffer(frame, dtype=np.uint8)
        return len(frame)


class PlaneCompressor(Protocol):
    """Codes a byte plane into one zstd frame in a caller buffer."""

    def compress_into(self, src: np.ndarray, dst: np.ndarray) -> int:
        """The frame's length in `dst`, or 0 when it would not fit there (the plane is then stored raw)."""
        ...


_local = threading.local()


def compressor(settings: tuple[int, int, int]) -> PlaneCompressor:
    """This thread's compressor for (window_log, hash_log, min_match): libzstd's accelerated one when it loads,
    else python-zstandard's (created on first use; contexts are not thread-safe)."""
    contexts: dict[tuple[int, int, int], PlaneCompressor] = _local.__dict__.setdefault("contexts", {})
    if settings not in contexts:
        lib = load()
        contexts[settings] = StandardCompressor(settings) if lib is None else NativeCompressor(lib, settings)
    return contexts[settings]
