"""`kvstore bench host`: the host tier's put and get beside a copy of the same bytes in the chunk's
own dtype (bf16), rounds alternated in one process; and the uint8 copy the tier used to make.

Every variant copies the same 32 MiB Llama-3-8B chunks; each round runs every variant once, in
turn, and a figure is the best round (the least disturbed on a shared machine).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
import xxhash

from bench.common import Record, gbps, print_records, record
from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import ChunkMeta, TierKind
from tiers import Tier, make_tier
from tiers.file_io import aligned_empty

LAYOUT = KVLayout.from_preset("llama-3-8b")  # 256-token chunks of 32 MiB, bf16
Fn = Callable[[], object]


def run(quick: bool = False) -> list[Record]:
    num_chunks, rounds = (4, 5) if quick else (16, 9)
    records = host_records(_payloads(num_chunks), rounds)
    print_records(f"kvstore bench host ({num_chunks} chunks of {LAYOUT.chunk_bytes >> 20} MiB, "
                  f"{torch.get_num_threads()} torch threads, best of {rounds} alternated rounds)", records)
    return records


def _payloads(num_chunks: int) -> list[torch.Tensor]:
    out = []
    for seed in range(num_chunks):
        p = aligned_empty(LAYOUT.chunk_bytes)
        p.view(torch.bfloat16).normal_(generator=torch.Generator().manual_seed(seed))
        out.append(p)
    return out


def best_of_alternated(variants: dict[str, Callable[[], object]], rounds: int,
                       setup: dict[str, Callable[[], object]] | None = None) -> dict[str, float]:
    """Best seconds of each variant over `rounds` rounds, each round running every variant once in
    turn, in order; `setup[name]`, when given, runs untimed before that variant."""
    setup = setup or {}
    best = dict.fromkeys(variants, float("inf"))
    for round_index in range(rounds + 1):  # round 0 warms up: page faults, allocators, thread pools
        for name, fn in variants.items():
            if name in setup:
                setup[name]()
            start = time.perf_counter()
            fn()
            if round_index:
                best[name] = min(best[name], time.perf_counter() - start)
    return best


def host_records(payloads: list[torch.Tensor], rounds: int) -> list[Record]:
    """host.put / host.get (the tier) and store.host.put / get (a host-only TieredStore) beside a bf16
    copy of the same bytes; beside it too copy.uint8 (what a uint8 view costs on this CPU) and
    copy.memcpy (numpy's one-thread memcpy of the same bytes)."""
    nbytes = sum(p.numel() for p in payloads)
    keys = [xxhash.xxh3_128_digest(str(i).encode()) for i in range(len(payloads))]
    outs = [aligned_empty(p.numel()) for p in payloads]
    tier = make_tier(TierKind.HOST, capacity_bytes=nbytes + (1 << 20))
    config = StoreConfig(layout=LAYOUT, tiers=(TierConfig(kind=TierKind.HOST, capacity_bytes=nbytes + (8 << 20)),))
    chunks = [p.view(LAYOUT.torch_dtype).view(LAYOUT.chunk_shape) for p in payloads]
    out_chunks = [o.view(LAYOUT.torch_dtype).view(LAYOUT.chunk_shape) for o in outs]
    with TieredStore(config) as store:
        variants, setup = _variants(tier, store, keys, payloads, outs, chunks, out_chunks)
        best = best_of_alternated(variants, rounds, setup)
        assert all(store.get_many(keys, out_chunks)) and torch.equal(outs[-1], payloads[-1])
    tier.close()
    rate = {name: gbps(nbytes, seconds) for name, seconds in best.items()}
    limit, base = rate["copy.bf16"], f"bf16 tensor copy ({torch.get_num_threads()} threads)"
    return [record(name, rate[name], "GB/s", base, limit)
            for name in ("host.put", "host.get", "store.host.put", "store.host.get", "copy.uint8", "copy.memcpy")]


def _memcpy(payloads: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
    for payload, out in zip(payloads, outs, strict=True):
        np.copyto(out.numpy(), payload.numpy())


def _variants(tier: Tier, store: TieredStore, keys: list[bytes], payloads: list[torch.Tensor],
              outs: list[torch.Tensor], chunks: list[torch.Tensor],
              out_chunks: list[torch.Tensor]) -> tuple[dict[str, Fn], dict[str, Fn]]:
    """The timed calls in round order (each get follows its put) and the untimed removals before a put."""
    meta = ChunkMeta(codec_id=0, raw_bytes=LAYOUT.chunk_bytes, stored_bytes=LAYOUT.chunk_bytes,
                     layout_fingerprint=LAYOUT.fingerprint)

    def copy(dtype: torch.dtype) -> None:
        for p, out in zip(payloads, outs, strict=True):
            out.view(dtype).copy_(p.view(dtype))

    def tier_put() -> None:
        for key, p in zip(keys, payloads, strict=True):
            tier.put(key, p, meta)

    def tier_get() -> None:
        for key, out in zip(keys, outs, strict=True):
            tier.get_into(key, out)

    variants: dict[str, Fn] = {
        "copy.bf16": lambda: copy(torch.bfloat16), "copy.uint8": lambda: copy(torch.uint8),
        "copy.memcpy": lambda: _memcpy(payloads, outs),
        "host.put": tier_put, "host.get": tier_get,
        "store.host.put": lambda: store.put_many(keys, chunks), "store.host.get": lambda: store.get_many(keys, out_chunks)}
    setup: dict[str, Fn] = {"host.put": lambda: [tier.remove(key) for key in keys],
                            "store.host.put": lambda: [store.remove(key) for key in keys]}
    return variants, setup
