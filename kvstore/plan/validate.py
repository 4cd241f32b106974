"""`kvstore plan --validate`: the planner's predictions beside this machine's store, measured.

Load time: the planner predicts `load_s(tokens, GB/s)` for a prompt's chunks with its bandwidth
inputs calibrated from raw primitives (one large memcpy; a raw O_DIRECT file read plus the chunk
checksum and the copy out), never from the store; then a real TieredStore (host + NVMe under a
temp dir) loads the same chunks from host and, after its host copies are dropped, from NVMe.
Hit rate: the planner's replay-based figure beside a direct `kvstore.replay` run and beside a
real host-only TieredStore driven with the same block sequence (lookup, then put the chain).
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.plan.bandwidth import load_s
from kvstore.plan.capacity import HitRateModel
from kvstore.plan.inputs import WorkloadParams
from kvstore.plan.model_cost import model_from_preset
from kvstore.plan.workload import load_trace, parametric_trace
from kvstore.replay import replay
from kvstore.store import TieredStore
from kvstore.trace import Trace
from kvstore.types import TierKind
from tiers.file_io import raw_odirect_throughput

logger = logging.getLogger(__name__)

HIT_LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=64, dtype="float16", chunk_tokens=16)  # 4 KiB chunks


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Raw bandwidths of this machine (GB/s) that the planner's load model takes as inputs."""

    memcpy_gbps: float
    odirect_read_gbps: float
    checksum_gbps: float
    is_direct: bool

    @property
    def nvme_gbps(self) -> float:
        """A disk chunk read is: raw read, then checksum, then copy out; the three run in series."""
        return 1.0 / (1.0 / self.odirect_read_gbps + 1.0 / self.checksum_gbps + 1.0 / self.memcpy_gbps)


def _best_s(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def calibrate(directory: Path, nbytes: int = 256 << 20, repeats: int = 3) -> Calibration:
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    memcpy_s = _best_s(lambda: dst.copy_(src), repeats)
    view = memoryview(src.numpy())
    checksum_s = _best_s(lambda: xxhash.xxh3_64_intdigest(view), repeats)
    raw = raw_odirect_throughput(str(directory), nbytes, repeats=repeats)
    return Calibration(memcpy_gbps=nbytes / memcpy_s / 1e9, odirect_read_gbps=raw["read_gbps"],
                       checksum_gbps=nbytes / checksum_s / 1e9, is_direct=bool(raw["direct"]))


def measure_load(directory: Path, layout: KVLayout, prompt_tokens: int, repeats: int = 3) -> dict[str, float]:
    """Seconds a real store takes to load `prompt_tokens` of KV from host, then from NVMe (best of)."""
    num_chunks = prompt_tokens // layout.chunk_tokens
    nbytes = num_chunks * layout.chunk_bytes
    config = StoreConfig.embedded(layout=layout, root_dir=directory, model_id="plan-validate",
                                  host_bytes=nbytes + (64 << 20), nvme_bytes=2 * nbytes + (64 << 20), promote_on_read=False)
    generator = torch.Generator().manual_seed(0)
    with TieredStore(config) as store:
        keys = store.chunk_keys(torch.randint(0, 128_000, (prompt_tokens,), generator=generator, dtype=torch.int32))
        chunks = [torch.randn(layout.chunk_shape, generator=generator).to(layout.torch_dtype) for _ in keys]
        store.put_many(keys, chunks)
        store.flush()
        outs = [torch.empty_like(c) for c in chunks]
        host_s = _best_s(lambda: store.get_many(keys, outs), repeats)
        store.drop_tier_copies(TierKind.HOST)
        nvme_s = _best_s(lambda: store.get_many(keys, outs), repeats)
        identical = all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))
    return {"nbytes": nbytes, "host_s": host_s, "nvme_s": nvme_s, "identical": float(identical)}


def load_rows(directory: Path, prompt_tokens: int = 4096) -> tuple[Calibration, list[dict[str, float | str]]]:
    """Predicted and measured load time of a Llama-3-8B prompt from host and from NVMe."""
    calibration = calibrate(directory)
    model = model_from_preset("llama-3-8b")
    measured = measure_load(directory, model.layout, prompt_tokens)
    rows: list[dict[str, float | str]] = []
    for tier, gbps in (("host", calibration.memcpy_gbps), ("nvme", calibration.nvme_gbps)):
        predicted = load_s(model, prompt_tokens, gbps)
        actual = measured[f"{tier}_s"]
        rows.append({"tier": tier, "tokens": prompt_tokens, "gbps_input": gbps, "predicted_ms": predicted * 1e3,
                     "measured_ms": actual * 1e3, "error": predicted / actual - 1.0})
    return calibration, rows


def store_hit_rate(trace: Trace, capacity_blocks: int, directory: Path) -> float:
    """Leading-run block hit rate of a real host-only LRU TieredStore fed the trace's block chains."""
    host = TierConfig(kind=TierKind.HOST, capacity_bytes=capacity_blocks * HIT_LAYOUT.chunk_bytes, eviction="lru")
    config = StoreConfig(layout=HIT_LAYOUT, tiers=(host,), model_id="plan-validate-hits")
    chunk = torch.zeros(HIT_LAYOUT.chunk_shape, dtype=HIT_LAYOUT.torch_dtype)
    hits = accesses = 0
    with TieredStore(config) as store:
        for request in trace.requests:
            keys = [int(b).to_bytes(16, "little") for b in request.block_ids]
            hits += store.lookup_keys(keys)
            accesses += len(keys)
            store.put_many(keys, [chunk] * len(keys))
    return hits / max(1, accesses)


def hit_rows(trace: Trace, pcts: tuple[float, ...], directory: Path) -> list[dict[str, float]]:
    model = HitRateModel(trace, "lru", block_bytes=HIT_LAYOUT.chunk_bytes)
    rows = []
    for pct in pcts:
        blocks = max(1, round(trace.num_distinct_blocks * pct / 100))
        planned = model.result(blocks).prefix_hit_rate
        replayed = replay(trace, "lru", blocks * 100.0 / trace.num_distinct_blocks).prefix_hit_rate
        rows.append({"capacity_blocks": blocks, "planned": planned, "replay": replayed,
                     "store": store_hit_rate(trace, blocks, directory)})
    return rows


def validation_trace(path: Path | None, num_requests: int = 1500) -> Trace:
    if path is not None:
        return load_trace(path, block_tokens=HIT_LAYOUT.chunk_tokens)[0].head(num_requests)
    return parametric_trace(WorkloadParams(sessions=100, turns=4, prompt_tokens=256, output_tokens=32),
                            block_tokens=HIT_LAYOUT.chunk_tokens)
