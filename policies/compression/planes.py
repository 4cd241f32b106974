"""Byte planes of a chunk: each value's top byte (sign and exponent), the rest, and the two merged back.

A bf16/fp16/fp32 value's most significant byte holds the sign and most of the exponent, which in
KV repeat (about 3 bits of entropy in 8 on the engine model's KV); the lower bytes are mantissa,
close to random. `zstd_planes.py` compresses the top plane and stores the rest as they are.

    value i (k bytes, little endian): [ b0 .. b(k-2) | b(k-1) ]  ->  top[i] = b(k-1)
                                                                     rest[i*(k-1) : (i+1)*(k-1)] = b0 .. b(k-2)

With numba (`plane_kernels.py`, GIL-free) a plane of 16-bit values takes one pass at about 10 GB/s per
core; without it (and for 4-byte values) numpy's strided copies, which also release the GIL, do the same
about 3x slower (logged once).
"""

from __future__ import annotations

import functools
from types import ModuleType

import numpy as np

from policies.compression.numba_support import optional_kernels


def _kernels() -> ModuleType | None:
    return optional_kernels("policies.compression.plane_kernels",
                            "the zstd codec splits byte planes with numpy (about 3x slower)")


@functools.cache
def warm() -> None:
    """Load the kernels (numba's first call costs ~0.2 s) now rather than inside a chunk's encode."""
    src, top, rest = np.zeros(8, dtype=np.uint8), np.empty(4, dtype=np.uint8), np.empty(4, dtype=np.uint8)
    top_only(src, 2, top)
    rest_only(src, 2, rest)
    merge(top, rest, 2, src)
    merge(src[:2], src[2:8], 4, src[:8])


def top_only(src: np.ndarray, itemsize: int, top: np.ndarray) -> None:
    """`split`'s top plane alone."""
    kernels = _kernels()
    if kernels is not None and itemsize == 2:
        kernels.high16(src.view(np.uint16), top)
    else:
        np.copyto(top, src.reshape(-1, itemsize)[:, itemsize - 1])


def rest_only(src: np.ndarray, itemsize: int, rest: np.ndarray) -> None:
    """`split`'s rest planes alone (itemsize >= 2)."""
    kernels = _kernels()
    if kernels is not None and itemsize == 2:
        kernels.low16(src.view(np.uint16), rest)
    else:
        np.copyto(rest.reshape(-1, itemsize - 1), src.reshape(-1, itemsize)[:, : itemsize - 1])


def merge(top: np.ndarray, rest: np.ndarray, itemsize: int, dst: np.ndarray) -> None:
    """The inverse of `split`: top and rest -> dst (uint8 [n * itemsize])."""
    kernels = _kernels()
    if itemsize == 1:
        np.copyto(dst, top)
    elif kernels is None:
        values = dst.reshape(-1, itemsize)
        np.copyto(values[:, itemsize - 1], top)
        np.copyto(values[:, : itemsize - 1], rest.reshape(-1, itemsize - 1))
    elif itemsize == 2:
        kernels.merge16(top, rest, dst.view(np.uint16))
    else:
        kernels.merge_n(top, rest, itemsize, dst)
