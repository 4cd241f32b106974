"""Run a per-block kernel over a chunk's rows on `threads` threads, in blocks of about 1 MiB of float32.

Why not torch's intra-op pool over the whole chunk: its OpenMP workers spin while they wait, so
on a machine whose cores are shared (an engine, other daemons) a parallel torch op over a whole
chunk slows down by 10-20x (measured: int8 encode 0.03 GB/s with 2 OpenMP threads under load,
0.67 GB/s on one). The GIL is released inside each op, so a plain thread pool spreads the blocks.
Block size: each torch op costs ~10-40 us of dispatch, so blocks of torch's grain size (32768
elements) spent most of their time there; 8x that measured 1.4-1.9x faster (0.09 -> 0.12-0.17 GB/s
int8 encode at load 12 on 2 cores). Blocks above the grain size go parallel inside torch when it
has more than one thread (the daemon runs torch with one).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

import torch

BLOCK_ELEMENTS = 1 << 18  # 1 MiB of float32 scratch per plane
_pools: dict[tuple[str, int], ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()
_scratch = threading.local()


def default_threads() -> int:
    """Codec threads when the config gives none (0): every core this process may run on."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _pool(threads: int, prefix: str = "kv-codec") -> ThreadPoolExecutor:
    with _pools_lock:
        if (prefix, threads) not in _pools:
            _pools[(prefix, threads)] = ThreadPoolExecutor(threads, thread_name_prefix=prefix)
        return _pools[(prefix, threads)]


def submit(threads: int, task: Callable[[], None]) -> Future[None]:
    """Run `task` on the process-wide pool of `threads` background decode threads (streamed decodes:
    the reading thread hands pieces over and goes on reading). One pool per thread count, so every
    chunk decoded at once shares the same `threads` cores."""
    return _pool(threads, "kv-stream").submit(task)


def _thread_scratch(rows: int, width: int) -> torch.Tensor:
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.numel() < 2 * rows * width:
        buffer = _scratch.buffer = torch.empty(2 * rows * width, dtype=torch.float32)
    return buffer[: 2 * rows * width].view(2, rows, width)


def for_blocks(num_rows: int, width: int, threads: int, kernel: Callable[[slice, torch.Tensor], None]) -> None:
    """Call kernel(rows, scratch) for consecutive row blocks; scratch is a float32 [2, block_rows, width]
    buffer owned by the calling thread (two planes: a value block and an auxiliary one). Returns when every
    block is done; re-raises the first error.

    The calling thread works too, and each thread claims the next block as it finishes one, so a
    worker that the OS does not schedule (a busy machine) or that is busy with another chunk only
    leaves more blocks to the others instead of holding up the chunk.
    """
    block_rows = max(1, BLOCK_ELEMENTS // width)
    spans = [slice(start, min(num_rows, start + block_rows)) for start in range(0, num_rows, block_rows)]
    for_each(len(spans), threads, lambda index: kernel(spans[index], _thread_scratch(block_rows, width)))


def for_each(count: int, threads: int, task: Callable[[int], None]) -> None:
    """Call task(i) for i in range(count) on up to `threads` threads (the caller's included), each thread
    claiming the next index as it finishes one (see `for_blocks`). Returns when every call is done;
    re-raises the first error."""
    threads = max(1, min(threads, count))
    claims = itertools.count()  # next() on it is atomic under the GIL

    def run() -> None:
        while (index := next(claims)) < count:
            task(index)

    helpers = [_pool(threads - 1).submit(run) for _ in range(threads - 1)]
    try:
        run()
    finally:
        wait(helpers)  # none may still write into the caller's buffers after we return
    for helper in helpers:
        helper.result()
