"""`kvstore bench lmcache`: kvstore's host store/retrieve beside LMCache's local CPU backend, same process.

One Llama-3-8B-shaped request (8,192 tokens = 32 chunks of 256 tokens, 32 MiB each in bf16; 2,048
with --quick) is stored into and retrieved from each system, rounds alternating kvstore and LMCache,
each figure the best round. Both sides get the same token tensor and start from and end in the
same engine memory, one contiguous tensor per chunk, so the bytes copied are equal and what differs
is each system's own work: token hashing, allocation, index and the copy itself. LMCache runs its
own LMCacheEngine (bench/lmcache_side.py). Each store starts empty: clearing is untimed on both
sides. Without LMCache installed (it lives in the integration env, scripts/integration_env.sh) the
suite says so in one line and returns no records.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bench.common import Record, gbps, print_records, record
from bench.host_copy import best_of_alternated
from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from tiers.file_io import aligned_empty

LAYOUT = KVLayout.from_preset("llama-3-8b")
PEER = "LMCache 0.5.6 local CPU"


def run(quick: bool = False) -> list[Record]:
    if importlib.util.find_spec("lmcache") is None:
        print("kvstore bench lmcache: LMCache is not installed in this python; run it with the integration env's "
              "(scripts/integration_env.sh). Nothing measured.")
        return []
    num_tokens, rounds = (2048, 5) if quick else (8192, 7)
    records = compare(num_tokens, rounds)
    print_records(f"kvstore bench lmcache ({num_tokens} tokens = {num_tokens // LAYOUT.chunk_tokens} chunks of "
                  f"{LAYOUT.chunk_bytes >> 20} MiB, {torch.get_num_threads()} torch threads, "
                  f"best of {rounds} alternated rounds)", records)
    return records


def _chunks(num: int, seed: int | None) -> list[torch.Tensor]:
    out = []
    for i in range(num):
        chunk = aligned_empty(LAYOUT.chunk_bytes).view(LAYOUT.torch_dtype).view(LAYOUT.chunk_shape)
        if seed is None:
            chunk.zero_()
        else:
            chunk.normal_(generator=torch.Generator().manual_seed(seed + i))
        out.append(chunk)
    return out


def compare(num_tokens: int, rounds: int) -> list[Record]:
    """Store and retrieve one request in kvstore and in LMCache, alternated; ratios kvstore / LMCache."""
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")  # read when LMCache's loggers are made, at import
    from bench import lmcache_side

    num_chunks = num_tokens // LAYOUT.chunk_tokens
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, 128_000, num_tokens, dtype=np.int64))
    chunks, outs = _chunks(num_chunks, seed=0), _chunks(num_chunks, seed=None)
    nbytes = num_chunks * LAYOUT.chunk_bytes
    config = StoreConfig(layout=LAYOUT, tiers=(TierConfig(kind=TierKind.HOST, capacity_bytes=nbytes + (8 << 20)),))
    instance_id, engine = lmcache_side.make_engine(LAYOUT, nbytes + (64 << 20))
    try:
        with TieredStore(config) as store:
            variants, setup = _variants(store, engine, tokens, chunks, outs)
            variants["copy"] = lambda: [o.copy_(c) for c, o in zip(chunks, outs, strict=True)]
            best = best_of_alternated(variants, rounds, setup)
            _check_round_trip(store, engine, tokens, chunks, outs)
    finally:
        lmcache_side.close_engine(instance_id)
    rate = {name: gbps(nbytes, seconds) for name, seconds in best.items()}
    copy = "bf16 tensor copy of the same chunks"
    return [record("lmcache.store", rate["kvstore.store"], "GB/s", f"{PEER} store", rate["lmcache.store"]),
            record("lmcache.retrieve", rate["kvstore.retrieve"], "GB/s", f"{PEER} retrieve", rate["lmcache.retrieve"]),
            record("kvstore.store_vs_copy", rate["kvstore.store"], "GB/s", copy, rate["copy"]),
            record("kvstore.retrieve_vs_copy", rate["kvstore.retrieve"], "GB/s", copy, rate["copy"]),
            record("lmcache.store_vs_copy", rate["lmcache.store"], "GB/s", copy, rate["copy"]),
            record("lmcache.retrieve_vs_copy", rate["lmcache.retrieve"], "GB/s", copy, rate["copy"])]


Fn = Callable[[], object]


def _variants(store: TieredStore, engine: Any, tokens: torch.Tensor, chunks: list[torch.Tensor],
              outs: list[torch.Tensor]) -> tuple[dict[str, Fn], dict[str, Fn]]:
    """The four timed calls, in round order (each retrieve follows its own store), and the untimed
    clears that make each store start empty."""
    variants: dict[str, Fn] = {
        "kvstore.store": lambda: store.put_many(store.chunk_keys(tokens), chunks),
        "lmcache.store": lambda: engine.store(tokens, chunks=chunks),
        "kvstore.retrieve": lambda: store.get_many(store.chunk_keys(tokens), outs),
        "lmcache.retrieve": lambda: engine.retrieve(tokens, chunks=outs),
    }
    setup: dict[str, Fn] = {
        "kvstore.store": lambda: [store.remove(key) for key in store.chunk_keys(tokens)],
        "lmcache.store": engine.clear,
    }
    return variants, setup


def _check_round_trip(store: TieredStore, engine: Any, tokens: torch.Tensor, chunks: list[torch.Tensor],
                      outs: list[torch.Tensor]) -> None:
    """Both systems held every chunk and gave back the same bytes (a bench of misses would be void)."""
    for retrieve in (lambda: all(store.get_many(store.chunk_keys(tokens), outs)),
                     lambda: bool(engine.retrieve(tokens, chunks=outs).all())):
        for out in outs:
            out.zero_()
        if not retrieve() or not all(torch.equal(c, o) for c, o in zip(chunks, outs, strict=True)):
            raise RuntimeError("a system under test lost or changed chunks; the figures would be void")
