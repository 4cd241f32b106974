"""CUDA launchers for block_copy.cu, compiled at run time through CuPy's RawModule (needs cupy + a GPU)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from gpu_kernels.reference import check_shapes
from kvstore.errors import LayoutMismatchError

logger = logging.getLogger(__name__)

SOURCE_PATH = Path(__file__).with_name("block_copy.cu")
THREADS_PER_BLOCK = 256
VECTOR_BYTES = 16


def is_available() -> bool:
    """True when cupy imports and torch sees a CUDA device."""
    if not torch.cuda.is_available():
        return False
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _module():  # type: ignore[no-untyped-def]
    import cupy

    module = cupy.RawModule(code=SOURCE_PATH.read_text(), options=("-std=c++17",))
    logger.info("compiled %s with CuPy RawModule", SOURCE_PATH.name)
    return module


def check_launch(paged_kv: torch.Tensor, block_ids: Sequence[int] | torch.Tensor, chunk: torch.Tensor) -> tuple[int, int]:
    """Shape, dtype, device and stride checks before a launch; returns (num_pages, page_bytes)."""
    num_pages = check_shapes(paged_kv, block_ids, chunk)
    if not (paged_kv.is_cuda and chunk.is_cuda) or paged_kv.device != chunk.device:
        raise LayoutMismatchError(
            f"CUDA gather/scatter needs both tensors on one GPU, got {paged_kv.device} and {chunk.device}; "
            "use gpu_kernels.reference for CPU tensors"
        )
    if not chunk.is_contiguous():
        raise LayoutMismatchError("the chunk must be contiguous; pass chunk.contiguous() or a fresh buffer")
    _, planes, _, page_size, heads, dim = paged_kv.shape
    s = paged_kv.stride()
    if s[5] != 1 or s[4] != dim or s[3] != heads * dim or s[0] != planes * s[1]:
        raise LayoutMismatchError(
            f"paged_kv strides {s} do not keep each page contiguous with mergeable layer/plane dims; "
            "allocate the cache with torch.empty(shape) (contiguous)"
        )
    return num_pages, page_size * heads * dim * paged_kv.element_size()


def _launch(kernel_name: str, src: torch.Tensor, dst: torch.Tensor, paged_kv: torch.Tensor,
            chunk: torch.Tensor, block_ids: Sequence[int] | torch.Tensor) -> None:
    import cupy

    num_pages, page_bytes = check_launch(paged_kv, block_ids, chunk)
    if num_pages == 0:
        return
    itemsize = paged_kv.element_size()
    ids = torch.as_tensor(block_ids, dtype=torch.long).to(paged_kv.device, non_blocking=True)
    aligned = page_bytes % VECTOR_BYTES == 0 and all(
        t.data_ptr() % VECTOR_BYTES == 0 for t in (paged_kv, chunk)
    ) and (paged_kv.stride(1) * itemsize) % VECTOR_BYTES == 0 and (paged_kv.stride(2) * itemsize) % VECTOR_BYTES == 0
    kernel = _module().get_function(f"{kernel_name}_{'v16' if aligned else 'b1'}")
    planes = paged_kv.shape[0] * paged_kv.shape[1]
    args = (
        src.data_ptr(), dst.data_ptr(), ids.data_ptr(), page_bytes,
        paged_kv.stride(1) * itemsize, paged_kv.stride(2) * itemsize, num_pages * page_bytes,
    )
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(paged_kv.device).cuda_stream)
    with cupy.cuda.Device(paged_kv.device.index or 0), stream:
        kernel((num_pages, planes), (THREADS_PER_BLOCK,), tuple(cupy.int64(a) if isinstance(a, int) else a for a in args))


def gather_blocks(paged_kv: torch.Tensor, block_ids: Sequence[int] | torch.Tensor, out_chunk: torch.Tensor) -> torch.Tensor:
    """CUDA gather: pages `block_ids` of `paged_kv` -> contiguous `out_chunk` (same GPU)."""
    _launch("gather_blocks", paged_kv, out_chunk, paged_kv, out_chunk, block_ids)
    return out_chunk


def scatter_blocks(chunk: torch.Tensor, block_ids: Sequence[int] | torch.Tensor, paged_kv: torch.Tensor) -> torch.Tensor:
    """CUDA scatter: contiguous `chunk` -> pages `block_ids` of `paged_kv` (same GPU, in place)."""
    _launch("scatter_blocks", chunk, paged_kv, paged_kv, chunk, block_ids)
    return paged_kv
