"""What the tier suites share: the chunk layout, seeded chunk payloads and the raw O_DIRECT baseline."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from bench.common import gbps
from kvstore.layout import KVLayout
from tiers.file_io import aligned_empty, as_buffer, open_file, pread_all, pwrite_all

LAYOUT = KVLayout.from_preset("llama-3-8b")  # 256-token chunks of 32 MiB


def payload_chunk(seed: int) -> torch.Tensor:
    """One chunk of random bf16 values (seeded) in page-aligned memory, as raw bytes."""
    out = aligned_empty(LAYOUT.chunk_bytes)
    out.view(torch.bfloat16).normal_(generator=torch.Generator().manual_seed(seed))
    return out


def raw_odirect(directory: Path, payloads: list[torch.Tensor]) -> tuple[float, float]:
    """Sequential O_DIRECT write then read of the same bytes, one file per chunk, in `directory`: GB/s."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [str(directory / f"raw-{i}.bin") for i in range(len(payloads))]
    nbytes = sum(p.numel() for p in payloads)
    start = time.perf_counter()
    for path, p in zip(paths, payloads, strict=True):
        fd, _ = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, direct=True)
        pwrite_all(fd, [as_buffer(p)], 0)
        os.close(fd)
    write_s = time.perf_counter() - start
    out = aligned_empty(payloads[0].numel())
    start = time.perf_counter()
    for path in paths:
        fd, _ = open_file(path, os.O_RDONLY, direct=True)
        pread_all(fd, [as_buffer(out)], 0)
        os.close(fd)
    read_s = time.perf_counter() - start
    for path in paths:
        os.unlink(path)
    return gbps(nbytes, write_s), gbps(nbytes, read_s)
