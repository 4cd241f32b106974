"""`kvstore bench codecs`: each codec's encode/decode GB/s on KV from the engine's model, beside the raw
O_DIRECT write/read of the same bytes (what a compressed NVMe tier must beat) and a memory copy.

    codecs.<name>.encode   baseline: raw O_DIRECT write of the same chunk bytes, this run
    codecs.<name>.decode   baseline: raw O_DIRECT read  (`none`: a single-threaded memcpy)
    codecs.<name>.ratio    raw bytes / stored bytes
    codecs.<name>.tier_get / tier_put: effective GB/s of an NVMe tier storing that codec, modelled from
        this run's figures as the `measured` policy does (policies/compression/measured.py: the slower of
        decode and ratio x disk read, stages overlapped across the tier's workers), beside raw O_DIRECT
    codecs.lz4-legacy.decode / .ratio: `lz4` is retired for writing (`codec = "lz4"` writes blosc-lz4),
        so only the decode that chunks already on disk still need is measured, beside raw O_DIRECT read

The KV comes from `bench.kv_model` (a prefill through connector/engine's Llama of this geometry).
Samples of a codec and of the disk alternate, so load from other processes hits both alike.
Lossy codecs also report their max and mean error.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.common import Record, gbps, print_records, record
from bench.kv_model import model_chunk
from kvstore.layout import KVLayout
from policies.compression import codec_names, make_codec
from policies.compression.profiles import CodecProfile
from policies.compression.registry import RETIRED_FOR_WRITING
from policies.compression.speed_check import effective_rates
from tiers.file_io import aligned_empty, as_buffer, open_file, pread_all, pwrite_all

SKIP = {"nvcomp-lz4"}  # its CPU path is blosc-lz4's; measured on a GPU only


def bench_layout(quick: bool) -> KVLayout:
    # Llama-3-8B KV geometry (8 KV heads x 128, 256-token chunks), fewer layers for a CPU run: 16 MiB / 4 MiB (quick)
    return KVLayout(num_layers=4 if quick else 16, num_kv_heads=8, head_dim=128, dtype="bfloat16", chunk_tokens=256)


def _errors(chunk: torch.Tensor, decoded: torch.Tensor, head_dim: int) -> tuple[float, float]:
    x = chunk.float().reshape(-1, head_dim)
    err = (decoded.float().reshape(-1, head_dim) - x).abs()
    amax = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    return float((err / amax).max()), float(err.mean() / x.abs().mean())


class RawDisk:
    """Raw O_DIRECT write and read of one chunk's bytes to a file in `directory` (the tier's limit)."""

    def __init__(self, directory: Path, nbytes: int) -> None:
        self.path = str(directory / "raw-odirect.bin")
        self.buffer = aligned_empty(nbytes)
        self.buffer.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8))

    def write(self) -> None:
        fd, _ = open_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, direct=True)
        try:
            pwrite_all(fd, [as_buffer(self.buffer)], 0)
        finally:
            os.close(fd)

    def read(self) -> None:
        fd, _ = open_file(self.path, os.O_RDONLY, direct=True)
        try:
            pread_all(fd, [as_buffer(self.buffer)], 0)
        finally:
            os.close(fd)


def alternating(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each fn, called in turns after one warm-up round."""
    samples: list[list[float]] = [[] for _ in fns]
    for step in range(repeats + 1):
        for times, fn in zip(samples, fns, strict=True):
            start = time.perf_counter()
            fn()
            if step:
                times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in samples]


def _codec_records(name: str, chunk: torch.Tensor, layout: KVLayout, disk: RawDisk, repeats: int) -> list[Record]:
    codec = make_codec(name)
    out = torch.empty_like(chunk)
    payload = codec.encode(chunk, layout)
    encode_s, write_s = alternating([lambda: codec.encode(chunk, layout), disk.write], repeats)
    decode_s, read_s = alternating([lambda: codec.decode_into(payload, out, layout), disk.read], repeats)
    raw = layout.chunk_bytes
    ratio = raw / payload.numel()
    write, read = gbps(raw, write_s), gbps(raw, read_s)
    profile = CodecProfile(ratio=ratio, encode_bytes_per_s=raw / encode_s, decode_bytes_per_s=raw / decode_s)
    get, put = (rate / 1e9 for rate in effective_rates(profile, name, read * 1e9, write * 1e9))
    records = [record(f"codecs.{name}.encode", gbps(raw, encode_s), "GB/s", "raw O_DIRECT write", write),
               record(f"codecs.{name}.decode", gbps(raw, decode_s), "GB/s", "raw O_DIRECT read", read),
               record(f"codecs.{name}.ratio", ratio, "x", "raw", 1.0),
               record(f"codecs.{name}.tier_put", put, "GB/s", "raw O_DIRECT write", write),
               record(f"codecs.{name}.tier_get", get, "GB/s", "raw O_DIRECT read", read)]
    if not codec.lossless:
        codec.decode_into(payload, out, layout)
        max_rel, mean_rel = _errors(chunk, out, layout.head_dim)
        bound = 1 / 254 + 2**-8 if name == "int8" else 2**-4 + 2**-8
        records.append(record(f"codecs.{name}.max_err_per_amax", max_rel, "", "stated bound", bound))
        records.append(record(f"codecs.{name}.mean_err_per_mean_abs", mean_rel, "", "bf16 rounding", 2**-9))
    return records


def _legacy_records(name: str, chunk: torch.Tensor, layout: KVLayout, disk: RawDisk,
                    repeats: int) -> list[Record]:
    """A codec retired for writing (RETIRED_FOR_WRITING): only its decode, which old chunks still need."""
    codec = make_codec(name)
    out = torch.empty_like(chunk)
    payload = codec.encode(chunk, layout)  # what a store wrote before the retirement
    decode_s, read_s = alternating([lambda: codec.decode_into(payload, out, layout), disk.read], repeats)
    raw = layout.chunk_bytes
    label = f"{name}-legacy"
    return [record(f"codecs.{label}.decode", gbps(raw, decode_s), "GB/s", "raw O_DIRECT read", gbps(raw, read_s)),
            record(f"codecs.{label}.ratio", raw / payload.numel(), "x", "raw", 1.0)]


def _none_vs_memcpy(chunk: torch.Tensor, layout: KVLayout, repeats: int) -> list[Record]:
    codec = make_codec("none")
    payload = codec.encode(chunk, layout)
    out = torch.empty_like(chunk)
    src, dst = chunk.reshape(-1).view(torch.uint8).numpy(), out.reshape(-1).view(torch.uint8).numpy()
    decode_s, copy_s = alternating([lambda: codec.decode_into(payload, out, layout), lambda: np.copyto(dst, src)],
                                    5 * repeats)  # milliseconds each: more samples against a busy machine
    copy = gbps(layout.chunk_bytes, copy_s)
    return [record("codecs.memcpy", copy, "GB/s", "memcpy (numpy, 1 thread)", copy),
            record("codecs.none.decode_vs_memcpy", gbps(layout.chunk_bytes, decode_s), "GB/s",
                   "memcpy (numpy, 1 thread)", copy)]


def run(quick: bool) -> list[Record]:
    """Records codecs.<name>.encode/.decode (vs raw O_DIRECT), .ratio, .tier_put/.tier_get, none vs memcpy,
    and codecs.<retired>-legacy.decode/.ratio for codecs only read now."""
    layout = bench_layout(quick)
    repeats = 3 if quick else 7
    chunk = model_chunk(layout, seed=1)
    with tempfile.TemporaryDirectory(prefix="kvbench-codecs-", dir=os.environ.get("KVSTORE_BENCH_DIR")) as tmp:
        disk = RawDisk(Path(tmp), layout.chunk_bytes)
        records = _none_vs_memcpy(chunk, layout, repeats)
        for name in codec_names():
            if name in RETIRED_FOR_WRITING:
                records += _legacy_records(name, chunk, layout, disk, repeats)
            elif name not in SKIP:
                records += _codec_records(name, chunk, layout, disk, repeats)
    for name, successor in RETIRED_FOR_WRITING.items():
        print(f"{name} is retired for writing (codec = {name!r} writes {successor}): only its decode is measured, "
              f"as codecs.{name}-legacy.decode, for chunks already on disk")
    print_records(f"codecs on a {layout.chunk_bytes / 2**20:.0f} MiB bf16 chunk {layout.chunk_shape} of the engine "
                  f"model's KV ({torch.get_num_threads()} torch threads)", records)
    return records
