"""`kvstore bench tiers`: put/get throughput of each tier for 32 MiB Llama-3-8B chunks, and lookup
latency of a 128k-token prompt, each beside its limit measured in the same run. The host rows are
`kvstore bench host`'s (bench/host_copy.py), the compressed NVMe rows `kvstore bench compressed`'s."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import xxhash

from bench.common import Record, best_time, gbps, print_records, record
from bench.compressed_tiers import compare
from bench.host_copy import host_records
from bench.tier_data import LAYOUT, payload_chunk, raw_odirect
from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import ChunkMeta, TierKind
from tiers import make_tier
from tiers.file_io import aligned_empty


def run(quick: bool = False) -> list[Record]:
    num_chunks = 4 if quick else 16
    repeats = 3 if quick else 5
    work = Path(tempfile.mkdtemp(prefix="kvbench-", dir=os.environ.get("KVSTORE_BENCH_DIR")))
    try:
        payloads = [payload_chunk(i) for i in range(num_chunks)]
        records = host_records(payloads, rounds=repeats)
        for kind in (TierKind.NVME, TierKind.PFS):
            records += _disk(kind, work / kind.value, payloads)
        records += _write_through(work, payloads)
        records += compare(payloads[:8], work / "compressed", rounds=repeats)
        records += _replicated(work, payloads)
        records += _lookup(repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_records(f"kvstore bench tiers ({num_chunks} chunks of {LAYOUT.chunk_bytes >> 20} MiB)", records)
    return records


def _meta(payload: torch.Tensor) -> ChunkMeta:
    return ChunkMeta(codec_id=0, raw_bytes=payload.numel(), stored_bytes=payload.numel(),
                     layout_fingerprint=LAYOUT.fingerprint)


def _keys(n: int) -> list[bytes]:
    return [xxhash.xxh3_128_digest(str(i).encode()) for i in range(n)]


def _disk(kind: TierKind, directory: Path, payloads: list[torch.Tensor]) -> list[Record]:
    nbytes = sum(p.numel() for p in payloads)
    raw_write, raw_read = raw_odirect(directory / "raw", payloads)
    tier = make_tier(kind, path=str(directory / "tier"), capacity_bytes=2 * nbytes, direct_io=True)
    keys = _keys(len(payloads))
    start = time.perf_counter()
    tier.put_many([(k, p, _meta(p)) for k, p in zip(keys, payloads, strict=True)])
    put_s = time.perf_counter() - start
    outs = [aligned_empty(p.numel()) for p in payloads]
    start = time.perf_counter()
    tier.get_many(keys, outs)
    get_s = time.perf_counter() - start
    assert all(torch.equal(a, b) for a, b in zip(outs, payloads, strict=True))
    tier.close()
    name = kind.value
    return [record(f"{name}.put", gbps(nbytes, put_s), "GB/s", "raw O_DIRECT write", raw_write),
            record(f"{name}.get", gbps(nbytes, get_s), "GB/s", "raw O_DIRECT read", raw_read)]


def _store_read_gbps(config: StoreConfig, chunks: list[torch.Tensor]) -> float:
    with TieredStore(config) as store:
        keys = _keys(len(chunks))
        store.put_many(keys, chunks)
        store.drop_tier_copies(TierKind.HOST)
        outs = [store.empty_chunk() for _ in chunks]
        start = time.perf_counter()
        ok = store.get_many(keys, outs)
        seconds = time.perf_counter() - start
        assert all(ok)
    return gbps(sum(c.numel() * c.element_size() for c in chunks), seconds)


def _write_through(work: Path, payloads: list[torch.Tensor]) -> list[Record]:
    """A store put of every chunk until its NVMe copy is written, beside raw O_DIRECT writes."""
    chunks = [p.view(LAYOUT.torch_dtype).view(LAYOUT.chunk_shape) for p in payloads]
    nbytes = sum(p.numel() for p in payloads)
    raw_write, _ = raw_odirect(work / "wt-raw", payloads)
    config = StoreConfig(layout=LAYOUT, tiers=(
        TierConfig(kind=TierKind.HOST, capacity_bytes=nbytes + LAYOUT.chunk_bytes),
        TierConfig(kind=TierKind.NVME, capacity_bytes=2 * nbytes, path=str(work / "wt-nvme"))))
    with TieredStore(config) as store:
        start = time.perf_counter()
        store.put_many(_keys(len(chunks)), chunks)
        store.flush()
        seconds = time.perf_counter() - start
    return [record("store.put_writethrough", gbps(nbytes, seconds), "GB/s", "raw O_DIRECT write", raw_write)]


def _replicated(work: Path, payloads: list[torch.Tensor]) -> list[Record]:
    chunks = [p.view(LAYOUT.torch_dtype).view(LAYOUT.chunk_shape) for p in payloads]
    cap = 2 * len(chunks) * (LAYOUT.chunk_bytes + 8192)
    host = TierConfig(kind=TierKind.HOST, capacity_bytes=2 * LAYOUT.chunk_bytes)
    nvme = TierConfig(kind=TierKind.NVME, capacity_bytes=cap, path=str(work / "r-nvme"))
    pfs = TierConfig(kind=TierKind.PFS, capacity_bytes=cap, path=str(work / "r-pfs"), options={"direct_io": True})
    single = _store_read_gbps(StoreConfig(tiers=(host, nvme), layout=LAYOUT, promote_on_read=False), chunks)
    shutil.rmtree(work / "r-nvme", ignore_errors=True)
    both = _store_read_gbps(StoreConfig(tiers=(host, nvme, pfs), layout=LAYOUT, promote_on_read=False), chunks)
    return [record("replicated.get", both, "GB/s", "single-tier store read (nvme)", single)]


def _lookup(repeats: int) -> list[Record]:
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=8, dtype="float16", chunk_tokens=256)
    tokens = np.random.default_rng(0).integers(0, 128_000, 128 * 1024, dtype=np.int32)
    config = StoreConfig(layout=layout, tiers=(TierConfig(kind=TierKind.HOST, capacity_bytes=8 << 20),))
    with TieredStore(config) as store:
        keys = store.chunk_keys(tokens)
        store.put_many(keys, [torch.zeros(layout.chunk_shape, dtype=torch.float16)] * len(keys))
        assert store.lookup(tokens) == len(tokens)
        array_s = best_time(lambda: store.lookup(tokens), repeats=repeats * 20)
        as_list = tokens.tolist()
        list_s = best_time(lambda: store.lookup(as_list), repeats=repeats * 4)
    data = tokens.tobytes()
    raw_s = best_time(lambda: xxhash.xxh3_128_digest(data), repeats=repeats * 20)
    return [record("lookup.128k", array_s * 1e3, "ms", "raw xxh3 over the same bytes", raw_s * 1e3),
            record("lookup.128k.list", list_s * 1e3, "ms", "raw xxh3 over the same bytes", raw_s * 1e3)]
