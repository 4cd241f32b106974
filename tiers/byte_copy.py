"""`copy_bytes`: copy one byte tensor into another in the widest element type both allow.

Tiers hold chunks as 1-D uint8 tensors, but torch's copy kernel runs per element: a uint8 copy of
32 MiB steps through 32 Mi elements and measures 10-20% below a bf16 or int64 copy of the same
bytes (docs/bench/host-copy.json: `kvstore bench hostcopy`). Viewing both sides as the widest
integer type their addresses and length allow gives the same bytes at the memory-copy limit, and
torch's intra-op threads split the copy as they would any tensor copy.
"""

from __future__ import annotations

import torch

_WIDEST_FIRST = ((8, torch.int64), (4, torch.int32), (2, torch.int16))


def widest_view_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The widest integer dtype every tensor's start address and byte length are multiples of."""
    for width, dtype in _WIDEST_FIRST:
        if all(t.data_ptr() % width == 0 and t.numel() % width == 0 for t in tensors):
            return dtype
    return torch.uint8


def copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst.copy_(src)` for contiguous 1-D uint8 tensors of equal length, at the widest element type.

    Falls back to a plain uint8 copy for non-contiguous or odd-sized tensors, so it is always safe
    where `copy_` was.
    """
    if (dst.dtype != torch.uint8 or src.dtype != torch.uint8 or dst.dim() != 1 or src.dim() != 1
            or not dst.is_contiguous() or not src.is_contiguous() or dst.numel() != src.numel()):
        dst.copy_(src)
        return
    dtype = widest_view_dtype(dst, src)
    if dtype is torch.uint8:
        dst.copy_(src)
        return
    dst.view(dtype).copy_(src.view(dtype))
