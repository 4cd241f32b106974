"""`kvstore bench compressed`: a store whose NVMe tier stores zstd or blosc-lz4 beside the same store
uncompressed, rounds alternated in one process, each figure beside its limits.

Each round runs, in turn: raw O_DIRECT write and read of the chunks, each codec's encode and decode
alone, and for each store (none, zstd, blosc-lz4) a write-through put until the NVMe copy is written
and a get of every chunk from NVMe (host copies dropped, untimed). Every figure is the best round, in
raw KV bytes per second. A compressed tier's limit is the slower of its codec alone and the disk moving
the smaller payload: min(codec GB/s, ratio x raw O_DIRECT GB/s); stages that added up instead of
overlapping would show as a ratio well below 1 against it.

The zstd and blosc-lz4 tiers run as a user gets them, `raw_when_encoder_busy = "auto"`: where the codec's
encode cannot keep 0.9 of the disk's write (by the speeds the compression policy judges with), a chunk whose
background write finds every encoder busy goes raw, so a CPU-bound encoder and the disk work side by side;
the bytes used say how much of the saving that costs, and the line before the table says which tiers went
that way; a store that mixes raw and encoded chunks has no codec limit, so its figures stand beside the
uncompressed store's. A fourth store, `zstd-always`, is the zstd tier with `raw_when_encoder_busy = false`:
every chunk encoded, the pipeline against its limit. Gets read into buffers already touched, as an engine's
are (pinned or GPU memory), so page faults are not part of any get. The disk probe that `compression = "measured"` runs at start
(tiers/disk_probe.py) is printed beside the raw O_DIRECT figures of the same run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
import xxhash

from bench.common import Record, gbps, print_records, record
from bench.tier_data import LAYOUT, payload_chunk, raw_odirect
from kvstore.config import StoreConfig, TierConfig
from kvstore.store import TieredStore
from kvstore.types import TierKind
from policies.compression import make_codec
from policies.compression.base import Codec
from tiers.disk_probe import probe_disk

CODECS = ("none", "zstd", "blosc-lz4")  # each tier with the default raw_when_encoder_busy = "auto"
ALWAYS = "zstd-always"  # the zstd tier with raw_when_encoder_busy = false: every chunk encoded
STORES = (*CODECS, ALWAYS)


def run(quick: bool = False) -> list[Record]:
    num_chunks, rounds = (4, 3) if quick else (8, 5)
    work = Path(tempfile.mkdtemp(prefix="kvbench-compressed-", dir=os.environ.get("KVSTORE_BENCH_DIR")))
    try:
        records = compare([payload_chunk(i) for i in range(num_chunks)], work, rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_records(f"kvstore bench compressed ({num_chunks} chunks of {LAYOUT.chunk_bytes >> 20} MiB, "
                  f"best of {rounds} alternated rounds; GB/s of raw KV)", records)
    return records


def compare(payloads: list[torch.Tensor], work: Path, rounds: int) -> list[Record]:
    chunks = [p.view(LAYOUT.torch_dtype).view(LAYOUT.chunk_shape) for p in payloads]
    nbytes = sum(p.numel() for p in payloads)
    keys = [xxhash.xxh3_128_digest(f"compressed-{i}".encode()) for i in range(len(chunks))]
    stores = {name: TieredStore(_config(name, work / name, nbytes)) for name in STORES}
    overflow = [name for name in CODECS[1:] if stores[name].levels[1].raw_when_busy(name)]
    print(f"raw_when_encoder_busy = \"auto\" stores raw what busy encoders cannot take on: {overflow or 'none'}")
    codecs = {name: make_codec(name) for name in CODECS if name != "none"}
    best: dict[str, float] = {}
    used: dict[str, int] = {}
    try:
        for _ in range(rounds):
            raw_write, raw_read = raw_odirect(work / "raw", payloads)
            _keep_best(best, {"raw.write": raw_write, "raw.read": raw_read})
            for name, codec in codecs.items():
                _keep_best(best, _codec_alone(name, codec, chunks))
            for name, store in stores.items():
                figures, used[name] = _put_get(name, store, keys, chunks)
                _keep_best(best, figures)
    finally:
        for store in stores.values():
            store.close()
    probe = probe_disk(str(work / "probe"))
    best |= {"probe.write": probe.write_bytes_per_s / 1e9, "probe.read": probe.read_bytes_per_s / 1e9}
    return _records(best, used, nbytes)


def _config(name: str, path: Path, nbytes: int) -> StoreConfig:
    codec = "zstd" if name == ALWAYS else name
    overflow: bool | Literal["auto"] = False if name == ALWAYS else "auto"
    return StoreConfig(layout=LAYOUT, promote_on_read=False, tiers=(
        TierConfig(kind=TierKind.HOST, capacity_bytes=nbytes + LAYOUT.chunk_bytes),
        TierConfig(kind=TierKind.NVME, capacity_bytes=2 * nbytes, path=str(path), codec=codec,
                   raw_when_encoder_busy=overflow)))


def _keep_best(best: dict[str, float], figures: dict[str, float]) -> None:
    for name, value in figures.items():
        best[name] = max(best.get(name, 0.0), value)


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _codec_alone(name: str, codec: Codec, chunks: list[torch.Tensor]) -> dict[str, float]:
    """GB/s of the codec's encode and decode of the same chunks, one after another in this thread."""
    nbytes = sum(c.numel() * c.element_size() for c in chunks)
    out = torch.empty_like(chunks[0])
    encoded: list[torch.Tensor] = []
    encode_s = _timed(lambda: encoded.extend(codec.encode(c, LAYOUT) for c in chunks))

    def decode_all() -> None:
        for payload in encoded:
            codec.decode_into(payload, out, LAYOUT)

    decode_s = _timed(decode_all)
    stored = sum(p.numel() for p in encoded)
    return {f"{name}.encode": gbps(nbytes, encode_s), f"{name}.decode": gbps(nbytes, decode_s),
            f"{name}.ratio": nbytes / stored}


def _put_get(name: str, store: TieredStore, keys: list[bytes],
             chunks: list[torch.Tensor]) -> tuple[dict[str, float], int]:
    """One write-through put and one get from NVMe of every chunk (each starting from an empty store)."""
    nbytes = sum(c.numel() * c.element_size() for c in chunks)
    for key in keys:
        store.remove(key)

    def put() -> None:
        assert store.put_many(keys, chunks).ok
        store.flush()

    put_s = _timed(put)
    store.drop_tier_copies(TierKind.HOST)
    used = store.stats()["tiers"]["nvme"]["used_bytes"]
    outs = [store.empty_chunk().zero_() for _ in chunks]  # touched first, as an engine's buffers are
    get_s = _timed(lambda: store.get_many(keys, outs))
    if not all(torch.equal(o, c) for o, c in zip(outs, chunks, strict=True)):
        raise RuntimeError(f"the {name} store gave back other bytes; the figures would be void")
    return {f"store.{name}.put": gbps(nbytes, put_s), f"store.{name}.get": gbps(nbytes, get_s)}, used


def _records(best: dict[str, float], used: dict[str, int], nbytes: int) -> list[Record]:
    out = [record("nvme.none.put", best["store.none.put"], "GB/s", "raw O_DIRECT write", best["raw.write"]),
           record("nvme.none.get", best["store.none.get"], "GB/s", "raw O_DIRECT read", best["raw.read"])]
    for name in CODECS[1:]:  # as configured by default: some chunks may go raw, so no codec limit bounds them
        out += [record(f"nvme.{name}.put", best[f"store.{name}.put"], "GB/s", "uncompressed nvme store put",
                       best["store.none.put"]),
                record(f"nvme.{name}.get", best[f"store.{name}.get"], "GB/s", "uncompressed nvme store get",
                       best["store.none.get"]),
                record(f"nvme.{name}.encode_alone", best[f"{name}.encode"], "GB/s", "raw O_DIRECT write",
                       best["raw.write"]),
                record(f"nvme.{name}.decode_alone", best[f"{name}.decode"], "GB/s", "raw O_DIRECT read",
                       best["raw.read"]),
                record(f"nvme.{name}.bytes_used", used[name] / 2**20, "MiB", "uncompressed nvme bytes used",
                       used["none"] / 2**20)]
    ratio = best["zstd.ratio"]  # every chunk encoded: the pipeline beside its limit
    put_limit = min(best["zstd.encode"], ratio * best["raw.write"])
    get_limit = min(best["zstd.decode"], ratio * best["raw.read"])
    out += [record(f"nvme.{ALWAYS}.{op}", best[f"store.{ALWAYS}.{op}"], "GB/s", f"uncompressed nvme store {op}",
                   best[f"store.none.{op}"]) for op in ("put", "get")]
    out += [record(f"nvme.{ALWAYS}.put_vs_limit", best[f"store.{ALWAYS}.put"], "GB/s",
                   f"min(zstd encode alone, ratio {ratio:.2f} x raw write)", put_limit),
            record(f"nvme.{ALWAYS}.get_vs_limit", best[f"store.{ALWAYS}.get"], "GB/s",
                   f"min(zstd decode alone, ratio {ratio:.2f} x raw read)", get_limit),
            record(f"nvme.{ALWAYS}.bytes_used", used[ALWAYS] / 2**20, "MiB", "uncompressed nvme bytes used",
                   used["none"] / 2**20),
            record("disk_probe.write", best["probe.write"], "GB/s", "raw O_DIRECT write", best["raw.write"]),
            record("disk_probe.read", best["probe.read"], "GB/s", "raw O_DIRECT read", best["raw.read"])]
    return out
