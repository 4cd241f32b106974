"""The int8/fp8 codecs' fast path: numba kernels (`lossy_kernels.py`) over bfloat16/float16/float32 chunks.

`kernels()` imports them once and logs which path the lossy codecs use; without numba (or for other
dtypes) `lossy.py` keeps its torch path, which writes the same bytes 5-15x slower (one core, bf16). Row ranges
of about 1 MiB go to `threads` threads (`blocks.for_blocks`); the kernels release the GIL.
"""

from __future__ import annotations

import logging
from types import ModuleType

import numpy as np
import torch

from policies.compression.blocks import for_blocks
from policies.compression.numba_support import optional_kernels

logger = logging.getLogger(__name__)

# input dtype -> (kernel kind, a torch integer dtype of its width, the numpy unsigned view of its bits)
_KINDS: dict[torch.dtype, tuple[int, torch.dtype, type[np.unsignedinteger]]] = {
    torch.bfloat16: (0, torch.int16, np.uint16),
    torch.float16: (1, torch.int16, np.uint16),
    torch.float32: (2, torch.int32, np.uint32),
}


def kernels() -> ModuleType | None:
    """The numba kernels module, or None when numba does not import (logged once)."""
    return optional_kernels("policies.compression.lossy_kernels",
                            "the int8/fp8 codecs use their torch path (5-15x slower)")


def supports(dtype: torch.dtype) -> bool:
    """Whether the numba path handles chunks of `dtype` (it also needs numba)."""
    return dtype in _KINDS and kernels() is not None


def _bits(x: torch.Tensor) -> np.ndarray:
    kind, int_dtype, unsigned = _KINDS[x.dtype]
    return x.view(int_dtype).numpy().view(unsigned)


def encode(x: torch.Tensor, is_fp8: bool, scales: torch.Tensor, codes: torch.Tensor, threads: int) -> None:
    """Rows of x ([rows, head_dim], CPU, contiguous) -> scales (float32 [rows]) and codes (uint8 [rows, head_dim])."""
    module = kernels()
    assert module is not None, "call supports() first"
    kind, bits = _KINDS[x.dtype][0], _bits(x)
    scales_np, codes_np = scales.numpy(), codes.numpy()
    for_blocks(x.shape[0], x.shape[1], threads, lambda rows, _scratch: module.encode_rows(
        bits, kind, is_fp8, scales_np, codes_np, rows.start, rows.stop))


def decode(codes: torch.Tensor, scales: torch.Tensor, is_fp8: bool, out: torch.Tensor, threads: int) -> None:
    """codes (uint8 [rows, head_dim]) x scales (float32 [rows]) -> out ([rows, head_dim], CPU, contiguous)."""
    module = kernels()
    assert module is not None, "call supports() first"
    kind, bits = _KINDS[out.dtype][0], _bits(out)
    codes_np, scales_np = codes.numpy(), scales.numpy()
    if is_fp8:
        for_blocks(codes.shape[0], codes.shape[1], threads, lambda rows, _scratch: module.decode_fp8_rows(
            codes_np, scales_np, kind, bits, rows.start, rows.stop))
    else:
        for_blocks(codes.shape[0], codes.shape[1], threads, lambda rows, _scratch: module.decode_rows(
            codes_np, scales_np, False, kind, bits, rows.start, rows.stop))
