"""`copy_bytes`: copy one byte tensor into another at the memory-copy limit.

Tiers hold chunks as 1-D uint8 tensors, but torch's copy kernel runs per element: a uint8 copy of
32 MiB steps through 32 Mi elements and measures 10-15% below a bf16 copy of the same bytes on the
2-core development VM (`kvstore bench host`, `copy.uint8`). Between CPU tensors the copy is
therefore memcpy (numpy's `copyto` of the bytes: dtype does not matter to it), spread over a small
pool in slices that each thread claims as it finishes one: torch's OpenMP threads wait for each
other, so a parallel torch copy stalls whenever one of them is descheduled on a shared machine,
where a claimed slice only delays itself (measured under load 20 on 2 cores: 1.46x a bf16 torch
copy with 2 OpenMP threads; docs/bench/host.json has the quiet figures). Copies to or from a device
use torch's copy in the widest integer type the addresses and length allow.

`copy_many` copies a batch of chunks with each thread claiming whole chunks: slicing every chunk
makes each one end on a wait for the other thread's last slice, and on the quiet 2-core VM that
capped 32 x 32 MiB at 12.1 GB/s against 13.1-13.2 GB/s for whole chunks (torch's 2-thread bf16
copy: 13.1).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

SLICE_BYTES = 8 << 20  # a slice a thread claims: large enough that claiming costs nothing
MAX_THREADS = 4  # memory bandwidth is shared: more threads than this only contend
_WIDEST_FIRST = ((8, torch.int64), (4, torch.int32), (2, torch.int16))
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def copy_threads() -> int:
    """Threads a large copy spreads over: the cores this process may use, at most MAX_THREADS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores))


def widest_view_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The widest integer dtype every tensor's start address and byte length are multiples of."""
    for width, dtype in _WIDEST_FIRST:
        if all(t.data_ptr() % width == 0 and t.numel() % width == 0 for t in tensors):
            return dtype
    return torch.uint8


def copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst.copy_(src)` for 1-D uint8 tensors of equal length, at the memory-copy limit.

    Anything else (other dtypes, strided or differently sized tensors) goes to a plain `copy_`, so it
    is safe wherever `copy_` was.
    """
    if (dst.dtype != torch.uint8 or src.dtype != torch.uint8 or dst.dim() != 1 or src.dim() != 1
            or not dst.is_contiguous() or not src.is_contiguous() or dst.numel() != src.numel()):
        dst.copy_(src)
        return
    if dst.device.type == "cpu" and src.device.type == "cpu" and not dst.requires_grad:
        _memcpy(dst.numpy(), src.numpy())
        return
    dtype = widest_view_dtype(dst, src)
    dst.view(dtype).copy_(src.view(dtype))


def copy_many(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
    """`copy_bytes(dst, src)` for every pair, each CPU byte pair copied whole by one of up to
    copy_threads() threads (this one and pool helpers claiming pairs, largest first).

    A pair larger than an even share of the batch (a single pair, or one large one beside small
    ones) is sliced over the threads by `copy_bytes` instead; pairs that are not contiguous 1-D
    uint8 CPU tensors of equal length are copied one by one with `copy_bytes`.
    """
    if len(dsts) != len(srcs):
        raise ValueError(f"copy_many got {len(dsts)} destinations but {len(srcs)} sources")
    pairs = list(zip(dsts, srcs, strict=True))
    is_bytes = [_is_cpu_bytes(d, s) for d, s in pairs]
    share = sum(s.numel() for (_, s), ok in zip(pairs, is_bytes, strict=True) if ok) // copy_threads()
    whole = [(d.numpy(), s.numpy()) for (d, s), ok in zip(pairs, is_bytes, strict=True) if ok and s.numel() <= share]
    for (d, s), ok in zip(pairs, is_bytes, strict=True):
        if not (ok and s.numel() <= share):
            copy_bytes(d, s)
    _copy_whole(sorted(whole, key=lambda pair: pair[1].nbytes, reverse=True))


def _is_cpu_bytes(dst: torch.Tensor, src: torch.Tensor) -> bool:
    return all(t.dtype == torch.uint8 and t.dim() == 1 and t.is_contiguous() and t.device.type == "cpu"
               and not t.requires_grad for t in (dst, src)) and dst.numel() == src.numel()


def _copy_whole(pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Copy each pair whole, claimed in order by this thread and up to copy_threads() - 1 pool helpers
    (none for less than a slice's bytes in all: a helper costs more to start than it saves)."""
    helpers = min(copy_threads(), len(pairs), -(-sum(s.nbytes for _, s in pairs) // SLICE_BYTES)) - 1
    claims = itertools.count()

    def run() -> None:
        while (i := next(claims)) < len(pairs):
            np.copyto(*pairs[i])

    futures = [_helpers().submit(run) for _ in range(max(0, helpers))]
    try:
        run()
    finally:
        _wait_started(futures)


def _memcpy(dst: np.ndarray, src: np.ndarray) -> None:
    """Copy in SLICE_BYTES slices claimed by this thread and up to copy_threads() - 1 pool helpers."""
    num_slices = -(-src.nbytes // SLICE_BYTES)
    helpers = min(copy_threads(), num_slices) - 1
    if helpers <= 0:
        np.copyto(dst, src)
        return
    claims = itertools.count()  # next() on it is atomic under the GIL

    def run() -> None:
        while (i := next(claims)) < num_slices:
            np.copyto(dst[i * SLICE_BYTES : (i + 1) * SLICE_BYTES], src[i * SLICE_BYTES : (i + 1) * SLICE_BYTES])

    futures = [_helpers().submit(run) for _ in range(helpers)]
    try:
        run()
    finally:
        _wait_started(futures)


def _wait_started(futures: list[Future[None]]) -> None:
    """Return once no helper still copies: one not started yet is cancelled (it would find no slice)."""
    for future in futures:
        if not future.cancel():
            future.result()


def _helpers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(MAX_THREADS - 1, thread_name_prefix="kv-copy")
        return _pool
