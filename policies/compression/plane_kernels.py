"""numba kernels for `planes.py`: split values into top byte and rest in one pass, and merge them back.

Serial and GIL-free (`nogil`): `zstd_planes.py` runs one per piece on each codec thread. One pass
reads each value once and writes both planes (numpy's two strided copies read the chunk twice).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def split16(src: np.ndarray, top: np.ndarray, rest: np.ndarray) -> None:  # pragma: no cover - compiled
    """src: uint16 [n] -> top: uint8 [n] (high bytes), rest: uint8 [n] (low bytes)."""
    for i in range(src.shape[0]):
        value = src[i]
        top[i] = np.uint8(value >> np.uint16(8))
        rest[i] = np.uint8(value & np.uint16(0xFF))


@njit(nogil=True, cache=True)
def merge16(top: np.ndarray, rest: np.ndarray, dst: np.ndarray) -> None:  # pragma: no cover - compiled
    """The inverse of split16."""
    for i in range(dst.shape[0]):
        dst[i] = (np.uint16(top[i]) << np.uint16(8)) | np.uint16(rest[i])


@njit(nogil=True, cache=True)
def split_n(src: np.ndarray, itemsize: int, top: np.ndarray, rest: np.ndarray) -> None:  # pragma: no cover
    """src: uint8 [n * itemsize] -> top: uint8 [n] (each value's last byte), rest: the others, in order."""
    low = itemsize - 1
    for i in range(top.shape[0]):
        for j in range(low):
            rest[i * low + j] = src[i * itemsize + j]
        top[i] = src[i * itemsize + low]


@njit(nogil=True, cache=True)
def merge_n(top: np.ndarray, rest: np.ndarray, itemsize: int, dst: np.ndarray) -> None:  # pragma: no cover
    """The inverse of split_n."""
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
