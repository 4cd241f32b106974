"""KVConnector on a real TieredStore: save pages, load them into other pages byte-exact, partial loads."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from connector.kv_connector import KVConnector
from kvstore.errors import ConfigError, KVStoreError
from tests.connector.conftest import CHUNK, MODEL, PAGE, prompt

NUM_BLOCKS = 32


def cache(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(MODEL.num_layers, 2, NUM_BLOCKS, PAGE, MODEL.num_kv_heads, MODEL.head_dim, generator=gen)


def test_save_then_load_into_other_pages_is_exact(store: Any) -> None:
    conn = KVConnector(store, PAGE)
    tokens = prompt(1, 3 * CHUNK + 2)
    src, dst = cache(1), torch.zeros(MODEL.num_layers, 2, NUM_BLOCKS, PAGE, MODEL.num_kv_heads, MODEL.head_dim)
    src_blocks, dst_blocks = list(range(13)), list(range(31, 18, -1))
    assert conn.save(tokens, src_blocks, src, num_tokens=len(tokens)) == 3
    assert conn.wait_for_save() == 3
    assert conn.get_num_matched_tokens(tokens) == 3 * CHUNK
    assert conn.get_num_matched_tokens(tokens, max_tokens=2 * CHUNK + 5) == 2 * CHUNK
    assert conn.load(tokens, dst_blocks, dst, start_token=CHUNK, end_token=3 * CHUNK) == 2 * CHUNK
    pages = CHUNK // PAGE
    for i in range(pages, 3 * pages):
        assert torch.equal(dst[:, :, dst_blocks[i]], src[:, :, src_blocks[i]])
    untouched = [b for b in range(NUM_BLOCKS) if b not in dst_blocks[pages : 3 * pages]]
    assert not dst[:, :, untouched].any()  # only the loaded chunks' pages were written


def test_load_stops_at_the_first_missing_chunk(store: Any) -> None:
    conn = KVConnector(store, PAGE)
    tokens = prompt(2, 3 * CHUNK)
    conn.save(tokens, list(range(12)), cache(2), num_tokens=len(tokens))
    conn.wait_for_save()
    key1 = store.chunk_keys(tokens)[1]
    store.flush()  # let the NVMe write-through land first: a remove racing it can be undone (reported)
    assert store.remove(key1)
    assert not store.contains(key1), store.stats()
    dst = torch.zeros_like(cache(0))
    assert conn.load(tokens, list(range(12)), dst) == CHUNK  # the store says 1 chunk now; load all it has
    assert dst[:, :, 4:].abs().sum() == 0
    assert conn.load(tokens, list(range(12)), dst, end_token=3 * CHUNK) == CHUNK  # asked for all 3: stops at the gap
    assert dst[:, :, 4:].abs().sum() == 0  # chunk 2 was found but not scattered: it would be out of order
    assert conn.stats()["load_failed_chunks"] == 2


def test_misaligned_ranges_and_page_sizes_are_refused(store: Any) -> None:
    with pytest.raises(ConfigError, match="multiple"):
        KVConnector(store, 5)
    conn = KVConnector(store, PAGE)
    with pytest.raises(KVStoreError, match="chunk aligned"):
        conn.start_load(prompt(3, 40), list(range(10)), cache(3), start_token=4, end_token=CHUNK)
