"""numba kernels for `planes.py` (16-bit values, and any width for the merge): take the top or the low bytes
of each value, and merge the two planes back, each in one pass at memory speed (numpy's strided copies run
about 3x slower). Serial and GIL-free (`nogil`): `zstd_planes.py` runs one per piece on each codec thread.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def merge16(top: np.ndarray, rest: np.ndarray, dst: np.ndarray) -> None:  # pragma: no cover - compiled
    """top: uint8 [n] (high bytes), rest: uint8 [n] (low bytes) -> dst: uint16 [n]."""
    for i in range(dst.shape[0]):
        dst[i] = (np.uint16(top[i]) << np.uint16(8)) | np.uint16(rest[i])


@njit(nogil=True, cache=True)
def merge_n(top: np.ndarray, rest: np.ndarray, itemsize: int, dst: np.ndarray) -> None:  # pragma: no cover
    """top: uint8 [n] (each value's last byte), rest: uint8 [n * (itemsize - 1)] (the others) -> dst."""
    low = itemsize - 1
    for i in range(top.shape[0]):
        for j in range(low):
            dst[i * itemsize + j] = rest[i * low + j]
        dst[i * itemsize + low] = top[i]


@njit(nogil=True, cache=True)
def low16(src: np.ndarray, rest: np.ndarray) -> None:  # pragma: no cover - compiled
    """src: uint16 [n] -> rest: uint8 [n] (low bytes only)."""
    for i in range(src.shape[0]):
        rest[i] = np.uint8(src[i] & np.uint16(0xFF))


@njit(nogil=True, cache=True)
def high16(src: np.ndarray, top: np.ndarray) -> None:  # pragma: no cover - compiled
    """src: uint16 [n] -> top: uint8 [n] (high bytes only)."""
    for i in range(src.shape[0]):
        top[i] = np.uint8(src[i] >> np.uint16(8))
