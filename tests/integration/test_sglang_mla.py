"""SGLang 0.5.23's MLA host pool (its own MLATokenToKVPoolHost over an MLATokenToKVPool on CPU, DeepSeek's 512 + 64
latent, bf16) with the kvstore HiCache backend and a daemon in kvstore's MLA layout.

Pages set from one layout's pool are kvstore MLA chunks [layers, 1, page, 1, 576] holding each token's latent; they
come back byte-identical into a pool of every MLA layout. TP rank 1 of an MLA model stores nothing (rank 0 writes
the same latents) and reads rank 0's pages, whatever the TP size; context parallelism is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("sglang.srt.mem_cache.hicache_storage", reason="SGLang is not installed: use scripts/integration_env.sh's env")

import torch

from connector.client import KVStoreClient
from kvstore.kv_scope import ModelIdentity, named_key
from kvstore.layout import AttentionKind, KVLayout
from service.process import Daemon
from tests.integration.conftest import start_daemon
from tests.integration.sglang_pool import (
    KV_LORA_RANK,
    LAYERS,
    PAGE,
    ROPE_DIM,
    make_backend,
    make_mla_host_pool,
    page_keys,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
NUM_PAGES = 4
LAYOUT = KVLayout(num_layers=LAYERS, num_kv_heads=1, head_dim=KV_LORA_RANK + ROPE_DIM, dtype="bfloat16",
                  chunk_tokens=PAGE, kind=AttentionKind.MLA)
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_unified"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    started = start_daemon(tmp_path_factory.mktemp("sglang_mla"), LAYOUT)
    yield started
    started.close()


def latents(pool: Any, indices: torch.Tensor) -> torch.Tensor:
    """Each token's latent per layer, [layers, tokens, 576], read with SGLang's own get_data_page (layer_first:
    [layers, page, 1, 576]; page_first: [page, layers, 1, 576])."""
    pages = [pool.get_data_page(int(i), flat=False) for i in indices[::PAGE]]
    if pool.layout == "page_first":
        pages = [p.transpose(0, 1) for p in pages]
    return torch.cat([p.reshape(LAYERS, PAGE, -1) for p in pages], dim=1)


def test_pages_are_mla_chunks_and_come_back_into_every_mla_layout(daemon: Daemon) -> None:
    writer_pool = make_mla_host_pool("layer_first")
    writer = make_backend(daemon.url, writer_pool, mla=True)
    keys, indices = page_keys(NUM_PAGES, salt="mla"), torch.arange(NUM_PAGES * PAGE)
    writer_pool.kv_buffer.normal_(generator=torch.Generator().manual_seed(8))
    expected = latents(writer_pool, indices).clone()
    assert writer.batch_set_v1(keys, indices) == [True] * NUM_PAGES
    writer.store.wait_saves()  # sets are queued: SGLang's backup thread never waits for the daemon

    identity = ModelIdentity(model="tiny-deepseek", kv_dtype="bfloat16", layout_fingerprint=LAYOUT.fingerprint,
                             engine="sglang")
    with KVStoreClient(daemon.url) as client:
        root = identity.scope().root(client.root_key)
        chunks = [torch.empty(LAYOUT.chunk_shape, dtype=torch.bfloat16) for _ in keys]
        assert all(client.get_many([named_key(root, k) for k in keys], chunks))
    stored = torch.cat([c[:, 0, :, 0] for c in chunks], dim=1)  # [layers, tokens, 576]: one latent a token and layer
    assert torch.equal(stored.view(torch.int16), expected.view(torch.int16))

    for layout in MLA_LAYOUTS:
        pool = make_mla_host_pool(layout)
        reader = make_backend(daemon.url, pool, mla=True)
        slots = torch.arange(NUM_PAGES * PAGE, 2 * NUM_PAGES * PAGE)  # other slots than the writer's
        assert reader.batch_exists(keys) == NUM_PAGES
        assert reader.batch_get_v1(keys, slots) == [True] * NUM_PAGES
        if layout in ("layer_first", "page_first"):  # the layouts SGLang's get_data_page reads
            assert torch.equal(latents(pool, slots).view(torch.int16), expected.view(torch.int16)), layout
        again = page_keys(NUM_PAGES, salt=f"again-{layout}")
        assert reader.batch_set_v1(again, slots) == [True] * NUM_PAGES  # the same latents, from this layout
        reader.store.wait_saves()
        with KVStoreClient(daemon.url) as client:
            copies = [torch.empty(LAYOUT.chunk_shape, dtype=torch.bfloat16) for _ in again]
            assert all(client.get_many([named_key(root, k) for k in again], copies))
        assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(copies, chunks, strict=True)), layout
        reader.close()
    writer.close()


def test_only_tp_rank_zero_writes_and_every_tp_size_reads_its_pages(daemon: Daemon) -> None:
    keys, indices = page_keys(2, salt="tp"), torch.arange(2 * PAGE)
    rank1_pool = make_mla_host_pool("page_first")
    rank1 = make_backend(daemon.url, rank1_pool, mla=True, tp_rank=1, tp_size=2)
    rank1_pool.kv_buffer.normal_(generator=torch.Generator().manual_seed(9))
    with KVStoreClient(daemon.url) as client:
        before = client.stats()["chunks"]
        assert rank1.batch_set_v1(keys, indices) == [True, True]
        rank1.store.wait_saves()
        assert client.stats()["chunks"] == before, "a TP rank > 0 stores nothing"
    assert rank1.batch_exists(keys) == 0
    tp1_pool = make_mla_host_pool("page_first")
    tp1 = make_backend(daemon.url, tp1_pool, mla=True)  # a TP=1 server writes the same pages
    tp1_pool.kv_buffer.copy_(rank1_pool.kv_buffer)
    assert tp1.batch_set_v1(keys, indices) == [True, True]
    tp1.store.wait_saves()
    rank1_pool.kv_buffer.zero_()
    assert rank1.batch_exists(keys) == 2, "the TP=2 server's rank 1 hits the TP=1 server's pages"
    assert rank1.batch_get_v1(keys, indices) == [True, True]
    written = slice(0, 2 * PAGE)  # page_first: [tokens, layers, 1, 576]
    assert torch.equal(rank1_pool.kv_buffer[written].view(torch.int16), tp1_pool.kv_buffer[written].view(torch.int16))
    for backend in (rank1, tp1):
        backend.close()


def test_context_parallel_mla_is_refused_in_one_line(daemon: Daemon) -> None:
    with pytest.raises(Exception, match="splits each MLA page by token") as caught:
        make_backend(daemon.url, make_mla_host_pool("layer_first"), mla=True, tp_rank=0, tp_size=2, dcp_size=2)
    assert "\n" not in str(caught.value)
