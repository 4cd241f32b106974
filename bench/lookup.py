"""`kvstore bench lookup`: the vLLM connector's scheduler-side lookup of a 128k-token prompt held as a
Python list, first and repeated, beside its targets and its floors, in one run.

The path measured is the connector's own: `ChunkPlanner.num_new_matched_tokens` (connector/vllm/plan.py)
with a real `ChunkHasher` over the request's token list and an embedded store's `lookup_keys`, every
chunk of the prompt held (the walk goes to the end). "first" is a request the planner has not seen;
"repeated" the same waiting request asked again, as vLLM's scheduler asks every step while it waits.
Floors, same run: a dict lookup (what a repeated call cannot beat), and the keys of the same tokens
already held as an int32 array (what a first call costs once the list is converted). `list_keys` is the
first call's keys alone, from the list (the C build packs and hashes it in one pass: ChunkHasher.extend). Peers, same run:
the pure-Python twins of the list's conversion (marshal) and of the key chain, which a process runs
without the C build (`pip install` makes it; kvstore/native_keys.py); the title says which one the planner used.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from bench.common import Record, print_records, record
from connector.vllm.plan import ChunkPlanner
from kvstore.config import StoreConfig, TierConfig
from kvstore.hashing import (
    TOKEN_DTYPE,
    ChunkHasher,
    as_token_array,
    chunk_keys,
    keys_implementation,
    python_chunk_keys,
    python_list_to_array,
)
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind

PROMPT_TOKENS = 131072
TARGET_FIRST_MS, TARGET_REPEATED_MS = 0.5, 0.05
LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=8, dtype="float16", chunk_tokens=256)  # 8 KiB chunks


@dataclass(frozen=True, slots=True)
class _Request:
    """The part of a vLLM Request the planner's key function reads."""

    request_id: str
    prompt_token_ids: list[int]


def run(quick: bool = False) -> list[Record]:
    repeats = 20 if quick else 100
    prompt = random.Random(0).choices(range(128_000), k=PROMPT_TOKENS)
    records = lookup_records(prompt, repeats)
    print_records(f"kvstore bench lookup ({PROMPT_TOKENS:,}-token prompt as a Python list, {LAYOUT.chunk_tokens}-token "
                  f"chunks, all held; keys in {keys_implementation()}; median of {repeats})", records)
    return records


def lookup_records(prompt: list[int], repeats: int) -> list[Record]:
    num_chunks = len(prompt) // LAYOUT.chunk_tokens
    config = StoreConfig(layout=LAYOUT, tiers=(
        TierConfig(kind=TierKind.HOST, capacity_bytes=(num_chunks + 1) * LAYOUT.chunk_bytes, eviction="lru"),))
    with TieredStore(config) as store:
        hasher = ChunkHasher(store.root_key, LAYOUT.chunk_tokens)
        hasher.extend(prompt)
        chunk = torch.zeros(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
        if not store.put_many(hasher.keys, [chunk] * len(hasher.keys)).ok:
            raise RuntimeError("the store did not take every chunk of the prompt; the lookups would miss")
        return _measure(store, prompt, repeats)


def _measure(store: TieredStore, prompt: list[int], repeats: int) -> list[Record]:
    def keys_of(request: object) -> ChunkHasher:
        assert isinstance(request, _Request)
        hasher = ChunkHasher(store.root_key, LAYOUT.chunk_tokens)
        hasher.extend(request.prompt_token_ids)
        return hasher

    planner = ChunkPlanner(keys_of, store.lookup_keys, chunk_tokens=LAYOUT.chunk_tokens, block_size=16)
    request = _Request("waiting", prompt)
    expected = len(prompt) - 1  # every chunk held: all but the last token, which vLLM computes itself
    fresh = iter(range(10**9))

    def first() -> int:
        return planner.num_new_matched_tokens(f"first-{next(fresh)}", request, len(prompt), 0)

    if first() != expected:
        raise RuntimeError(f"the lookup found {first()} tokens, the store holds {expected}; the figures would be void")
    planner.num_new_matched_tokens("waiting", request, len(prompt), 0)
    as_array = np.asarray(prompt, dtype=TOKEN_DTYPE)
    seen = {"waiting": object()}
    ms = {"first": _median_ms(first, repeats),
          "repeated": _median_ms(lambda: planner.num_new_matched_tokens("waiting", request, len(prompt), 0), repeats),
          "dict": _median_ms(lambda: seen.get("waiting"), repeats),
          "array_keys": _median_ms(lambda: chunk_keys(as_array, store.root_key, LAYOUT.chunk_tokens), repeats),
          "list_keys": _median_ms(lambda: ChunkHasher(store.root_key, LAYOUT.chunk_tokens).extend(prompt), repeats),
          "list_to_array": _median_ms(lambda: as_token_array(prompt), repeats),
          "python_list_to_array": _median_ms(lambda: python_list_to_array(prompt), repeats),
          "python_array_keys": _median_ms(lambda: python_chunk_keys(as_array, store.root_key, LAYOUT.chunk_tokens),
                                          repeats)}
    return [record("lookup.first", ms["first"], "ms", "target", TARGET_FIRST_MS),
            record("lookup.first_vs_array", ms["first"], "ms", "keys of the tokens as an int32 array", ms["array_keys"]),
            record("lookup.list_keys", ms["list_keys"], "ms", "keys of the tokens as an int32 array", ms["array_keys"]),
            record("lookup.list_to_int32", ms["list_to_array"], "ms", "keys of the tokens as an int32 array",
                   ms["array_keys"]),
            record("lookup.list_to_int32_vs_python", ms["list_to_array"], "ms", "the same in pure Python (marshal)",
                   ms["python_list_to_array"]),
            record("lookup.array_keys_vs_python", ms["array_keys"], "ms", "the same keys in pure Python",
                   ms["python_array_keys"]),
            record("lookup.repeated", ms["repeated"], "ms", "target", TARGET_REPEATED_MS),
            record("lookup.repeated_vs_dict", ms["repeated"], "ms", "a dict lookup", ms["dict"])]


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3
