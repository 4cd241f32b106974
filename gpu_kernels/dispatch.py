"""Pick the gather/scatter implementation per call: CUDA kernels for GPU tensors when CuPy is there, torch otherwise."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import torch

from gpu_kernels import cuda, reference

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def active_backend() -> str:
    """'cuda' when CuPy and a CUDA device are present, else 'torch'; logged once."""
    if cuda.is_available():
        logger.info("gpu_kernels: using CUDA block gather/scatter (CuPy RawModule)")
        return "cuda"
    logger.info("gpu_kernels: CuPy or CUDA missing; using the torch reference gather/scatter")
    return "torch"


def _use_cuda(*tensors: torch.Tensor) -> bool:
    return all(t.is_cuda for t in tensors) and active_backend() == "cuda"


def gather_blocks(paged_kv: torch.Tensor, block_ids: Sequence[int] | torch.Tensor, out_chunk: torch.Tensor) -> torch.Tensor:
    """Pages `block_ids` of `paged_kv` [layers, planes, blocks, page, heads, dim] -> `out_chunk`
    [layers, planes, len(block_ids)*page, heads, dim]. Raises LayoutMismatchError on bad shapes."""
    if _use_cuda(paged_kv, out_chunk):
        return cuda.gather_blocks(paged_kv, block_ids, out_chunk)
    return reference.gather_blocks(paged_kv, block_ids, out_chunk)


def scatter_blocks(chunk: torch.Tensor, block_ids: Sequence[int] | torch.Tensor, paged_kv: torch.Tensor) -> torch.Tensor:
    """The reverse of `gather_blocks`: `chunk` -> pages `block_ids` of `paged_kv`, in place."""
    if _use_cuda(paged_kv, chunk):
        return cuda.scatter_blocks(chunk, block_ids, paged_kv)
    return reference.scatter_blocks(chunk, block_ids, paged_kv)
