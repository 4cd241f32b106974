"""`kvstore bench layouts`: three models' chunks (three chunk sizes) in one shared host arena, one eviction order,
beside the same three models each in an arena of its own (a third of the bytes each: a daemon per model). The
same seeded stream of puts and gets runs through both; figures: how full the arenas stay under eviction (holes
between chunks of different sizes), and put/get speed.

Models, 16-token chunks: Llama-3-8B (2 MiB), Qwen2.5-7B (0.88 MiB), DeepSeek-V3's MLA latent (1.07 MiB). Each
round runs both set-ups in turn; a speed is the best round, a fill the mean over the rounds.
"""

from __future__ import annotations

import random
import time
from contextlib import ExitStack

import torch

from bench.common import Record, gbps, print_records, record
from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind

CHUNK_TOKENS = 16
MODELS = tuple(KVLayout.from_preset(name, chunk_tokens=CHUNK_TOKENS) for name in ("llama-3-8b", "qwen2.5-7b", "deepseek-v3"))
BATCH = 8


def run(quick: bool = False) -> list[Record]:
    arena_bytes, num_bytes, rounds = ((48 << 20), (512 << 20), 3) if quick else ((192 << 20), (3 << 30), 5)
    shared, apart = {"fill": 0.0, "put": 0.0, "get": 0.0}, {"fill": 0.0, "put": 0.0, "get": 0.0}
    for _ in range(rounds):
        for best, is_shared in ((shared, True), (apart, False)):
            figures = _one_round(arena_bytes, num_bytes, shared=is_shared)
            best.update(fill=best["fill"] + figures["fill"] / rounds, put=max(best["put"], figures["put"]),
                        get=max(best["get"], figures["get"]))
    peer = "an arena per model"
    records = [record("arena fill under eviction, one shared arena", shared["fill"], "fraction", peer, apart["fill"]),
               record("put, one shared arena", shared["put"], "GB/s", peer, apart["put"]),
               record("get, one shared arena", shared["get"], "GB/s", peer, apart["get"])]
    print_records(f"kvstore bench layouts (3 models, {arena_bytes >> 20} MiB of host arena in all, "
                  f"{num_bytes >> 20} MiB streamed, {rounds} rounds)", records)
    return records


def _store(layouts: tuple[KVLayout, ...], arena_bytes: int) -> TieredStore:
    config = StoreConfig(layout=layouts[0], tiers=(TierConfig(kind=TierKind.HOST, capacity_bytes=arena_bytes),),
                         any_layout=True, put_timeout_s=5.0)
    store = TieredStore(config)
    for layout in layouts:
        store.register_layout(layout)
    return store


def _one_round(arena_bytes: int, num_bytes: int, *, shared: bool) -> dict[str, float]:
    """Stream `num_bytes` of chunks (models picked at random, seeded) in batches of BATCH: each put, then read."""
    rng = random.Random(0)
    samples = {m.fingerprint: torch.randn(m.chunk_shape).to(m.torch_dtype) for m in MODELS}
    with ExitStack() as stack:
        if shared:
            one = stack.enter_context(_store(MODELS, arena_bytes))
            stores = {m.fingerprint: one for m in MODELS}
        else:
            stores = {m.fingerprint: stack.enter_context(_store((m,), arena_bytes // len(MODELS))) for m in MODELS}
        tiers = list({id(s): s.levels[0].tier for s in stores.values()}.values())
        fills: list[float] = []
        put_s = get_s = 0.0
        moved = n = 0
        while moved < num_bytes:
            model = MODELS[rng.randrange(len(MODELS))]
            store, chunks = stores[model.fingerprint], [samples[model.fingerprint]] * BATCH
            keys = [(n + i).to_bytes(16, "little") for i in range(BATCH)]
            n += BATCH
            start = time.perf_counter()
            store.put_many(keys, chunks)
            put_s += time.perf_counter() - start
            outs = [torch.empty_like(chunk) for chunk in chunks]
            start = time.perf_counter()
            store.get_many(keys, outs)
            get_s += time.perf_counter() - start
            moved += BATCH * model.chunk_bytes
            if moved > 2 * arena_bytes:  # every arena has turned over: eviction decides what stays
                fills.append(sum(t.used_bytes for t in tiers) / sum(t.capacity_bytes for t in tiers))
    return {"fill": sum(fills) / len(fills), "put": gbps(moved, put_s), "get": gbps(moved, get_s)}
