"""`kvstore bench codec_sweep`: blosc2 settings (level, shuffle, block size, split mode, threads) on the
engine model's KV, each encode/decode beside the raw O_DIRECT write/read of the same run (`bench.codecs`).

    sweep.<codec>.<level>.<shuffle>.<block>.<split>.t<threads>.encode   baseline: raw O_DIRECT write
    sweep.<...>.decode                                                  baseline: raw O_DIRECT read
    sweep.<...>.ratio                                                   raw bytes / stored bytes
    sweep.zstd.w<window_log>.h<hash_log>.m<min_match>.t<threads>.encode|decode|ratio   the `zstd` codec

This is how blosc-lz4's and blosc-zstd's defaults (policies/compression/blosc.py) and the `zstd`
codec's Zstandard parameters (policies/compression/zstd_planes.py) were picked: the fastest setting
whose encode and decode beat the disk, then the best ratio among those.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

import blosc2
import numpy as np
import torch

from bench.codecs import RawDisk, alternating, bench_layout
from bench.common import Record, gbps, print_records, record
from bench.kv_model import model_chunk
from kvstore.layout import KVLayout
from policies.compression import make_codec

_CODECS = {"lz4": blosc2.Codec.LZ4, "zstd": blosc2.Codec.ZSTD}
_FILTERS = {"bit": blosc2.Filter.BITSHUFFLE, "byte": blosc2.Filter.SHUFFLE}
_SPLITS = {"auto": blosc2.SplitMode.AUTO_SPLIT, "always": blosc2.SplitMode.ALWAYS_SPLIT,
           "never": blosc2.SplitMode.NEVER_SPLIT}


def _grid(quick: bool) -> list[tuple[str, int, str, int, str, int]]:
    """(codec, level, shuffle, block bytes (0 = blosc2's choice), split, threads) to try."""
    threads = len(os.sched_getaffinity(0))
    if quick:
        return [("zstd", 1, "bit", 0, "auto", threads), ("zstd", 1, "byte", 0, "always", threads),
                ("lz4", 1, "bit", 0, "auto", threads)]
    zstd = itertools.product(["zstd"], [1, 3], ["bit", "byte"], [0, 1 << 18, 1 << 20], ["auto", "always", "never"],
                             sorted({1, threads}))
    lz4 = itertools.product(["lz4"], [1, 5], ["bit", "byte"], [0, 1 << 20], ["auto"], [threads])
    return [*zstd, *lz4]


def _setting_records(setting: tuple[str, int, str, int, str, int], raw: np.ndarray, disk: RawDisk,
                     repeats: int) -> list[Record]:
    codec, level, shuffle, block, split, threads = setting
    cparams = {"codec": _CODECS[codec], "clevel": level, "typesize": 2, "filters": [_FILTERS[shuffle]],
               "filters_meta": [0], "nthreads": threads, "blocksize": block, "splitmode": _SPLITS[split]}
    packed = blosc2.compress2(raw, **cparams)
    out = np.empty_like(raw)
    encode_s, write_s = alternating([lambda: blosc2.compress2(raw, **cparams), disk.write], repeats)
    decode_s, read_s = alternating([lambda: blosc2.decompress2(packed, dst=out, nthreads=threads), disk.read],
                                    repeats)
    assert np.array_equal(out, raw)
    name = f"sweep.blosc-{codec}.L{level}.{shuffle}.{block >> 10 or 'auto'}{'K' if block else ''}.{split}.t{threads}"
    nbytes = raw.nbytes
    return [record(f"{name}.encode", gbps(nbytes, encode_s), "GB/s", "raw O_DIRECT write", gbps(nbytes, write_s)),
            record(f"{name}.decode", gbps(nbytes, decode_s), "GB/s", "raw O_DIRECT read", gbps(nbytes, read_s)),
            record(f"{name}.ratio", nbytes / len(packed), "x", "raw", 1.0)]


def _zstd_grid(quick: bool) -> list[tuple[int, int, int, int]]:
    """(window_log, hash_log, min_match, threads) of the `zstd` codec to try."""
    threads = len(os.sched_getaffinity(0))
    if quick:
        return [(17, 7, 7, threads), (17, 12, 4, threads)]
    return [*itertools.product([15, 17, 19], [6, 7, 8, 12], [4, 6, 7], [threads])]


def _zstd_records(setting: tuple[int, int, int, int], chunk: torch.Tensor, layout: KVLayout, disk: RawDisk,
                  repeats: int) -> list[Record]:
    window_log, hash_log, min_match, threads = setting
    codec = make_codec("zstd", threads=threads, window_log=window_log, hash_log=hash_log, min_match=min_match)
    payload = codec.encode(chunk, layout)
    out = torch.empty_like(chunk)
    encode_s, write_s = alternating([lambda: codec.encode(chunk, layout), disk.write], repeats)
    decode_s, read_s = alternating([lambda: codec.decode_into(payload, out, layout), disk.read], repeats)
    assert torch.equal(out.view(torch.uint8), chunk.view(torch.uint8))
    name, nbytes = f"sweep.zstd.w{window_log}.h{hash_log}.m{min_match}.t{threads}", layout.chunk_bytes
    return [record(f"{name}.encode", gbps(nbytes, encode_s), "GB/s", "raw O_DIRECT write", gbps(nbytes, write_s)),
            record(f"{name}.decode", gbps(nbytes, decode_s), "GB/s", "raw O_DIRECT read", gbps(nbytes, read_s)),
            record(f"{name}.ratio", nbytes / payload.numel(), "x", "raw", 1.0)]


def run(quick: bool) -> list[Record]:
    """Records sweep.<setting>.encode/.decode/.ratio for each blosc2 setting and `zstd` setting of the grids."""
    layout = bench_layout(quick)
    chunk = model_chunk(layout, seed=1)
    raw = chunk.reshape(-1).view(torch.uint8).numpy()
    records: list[Record] = []
    with tempfile.TemporaryDirectory(prefix="kvbench-sweep-", dir=os.environ.get("KVSTORE_BENCH_DIR")) as tmp:
        disk = RawDisk(Path(tmp), layout.chunk_bytes)
        for setting in _grid(quick):
            records += _setting_records(setting, raw, disk, 3 if quick else 5)
        for zstd_setting in _zstd_grid(quick):
            records += _zstd_records(zstd_setting, chunk, layout, disk, 3 if quick else 5)
    print_records(f"blosc2 and zstd settings on a {layout.chunk_bytes >> 20} MiB bf16 chunk of the engine model's KV", records)
    return records
