"""LMCache 0.5.6's MLA path (its own LMCacheEngine on CPU, LMCacheMetadata with use_mla and the MLA kv_shape LMCache
builds for vLLM: (layers, 1, chunk, 1, kv_lora_rank + rope)) with the kvstore plugin and a daemon in kvstore's MLA
layout: a fresh engine retrieves the latents byte-identical, and an MLA engine is refused by an MHA daemon.

A CPU stand-in for LMCache's GPU connector copies between a flat [1, layers, tokens, 576] latent tensor (LMCache's
MLA buffer, one plane) and LMCache's buffers; everything else is LMCache's code.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest

pytest.importorskip("lmcache.v1.cache_engine", reason="LMCache is not installed: use scripts/integration_env.sh's env")

import torch
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata

from connector.lmcache.plugin import live_connectors, require_remote
from kvstore.errors import KVStoreError
from kvstore.layout import AttentionKind, KVLayout
from tests.integration.test_lmcache import FlatKVConnector, wait_stored

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
CHUNK, LAYERS, LATENT, NUM_CHUNKS = 32, 3, 576, 3
LAYOUT = KVLayout(num_layers=LAYERS, num_kv_heads=1, head_dim=LATENT, dtype="bfloat16", chunk_tokens=CHUNK,
                  kind=AttentionKind.MLA)
_ids = itertools.count()


class FlatLatentConnector(FlatKVConnector):
    """LMCache's GPU connector contract on CPU for MLA: `kv` (kwarg) is [1, layers, tokens, latent]."""

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([1, LAYERS, num_tokens, LATENT])


def make_mla_engine(url: str) -> Any:
    """An LMCache engine for an MLA model, its metadata as LMCache's vLLM integration builds it (use_mla, one plane,
    one head of kv_lora_rank + rope), on the kvstore plugin."""
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.05, save_unfull_chunk=False, remote_serde="naive",
        pre_caching_hash_algorithm="sha256_cbor", remote_storage_plugins=["kvstore"],
        extra_config={"remote_storage_plugin.kvstore.module_path": "connector.lmcache.plugin",
                      "remote_storage_plugin.kvstore.class_name": "KVStoreRemoteConnector",
                      "remote_storage_plugin.kvstore.url": url})
    metadata = LMCacheMetadata(model_name="tiny-deepseek", world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=(LAYERS, 1, CHUNK, 1, LATENT),
                               use_mla=True, chunk_size=CHUNK)
    engine = LMCacheEngineBuilder.get_or_create(f"kvstore-mla-{next(_ids)}", config, metadata, FlatLatentConnector(),
                                                lambda t, r: None, lambda o, r: o)
    engine.post_init()
    return engine


def test_mla_latents_stored_then_retrieved_byte_identical_by_a_fresh_engine(daemon_factory: Any) -> None:
    daemon = daemon_factory(LAYOUT)
    prompt = torch.randint(0, 30000, (NUM_CHUNKS * CHUNK,), generator=torch.Generator().manual_seed(4)).tolist()
    source = torch.randn(1, LAYERS, len(prompt), LATENT, generator=torch.Generator().manual_seed(4)).bfloat16()
    writer = make_mla_engine(daemon.url)
    require_remote(writer)
    (plugin,) = [c for c in live_connectors() if c.store is not None and c.layout == LAYOUT]
    assert plugin.layout.kind is AttentionKind.MLA and plugin.layout.num_planes == 1
    writer.store(prompt, kv=source)
    wait_stored(daemon.url, NUM_CHUNKS)
    reader = make_mla_engine(daemon.url)
    require_remote(reader)
    assert reader.lookup(prompt) == len(prompt)
    target = torch.zeros_like(source)
    assert int(reader.retrieve(prompt, kv=target).sum()) == len(prompt)
    assert torch.equal(target.view(torch.int16), source.view(torch.int16)), "byte-identical latents"
    for engine in (writer, reader):
        engine.close()


def test_an_mla_engine_is_refused_by_a_daemon_with_an_mha_layout(daemon_factory: Any,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """The plugin asks for the MLA layout (one 576-wide plane), not K and V planes of one 576-wide head."""
    mha = daemon_factory(KVLayout(num_layers=LAYERS, num_kv_heads=1, head_dim=LATENT, dtype="bfloat16",
                                  chunk_tokens=CHUNK), name="mha")
    with caplog.at_level(logging.ERROR, logger="connector.lmcache.plugin"):
        engine = make_mla_engine(mha.url)
    assert "kvstore LMCache plugin cannot start" in caplog.text and "mla" in caplog.text.lower()
    with pytest.raises(KVStoreError):
        require_remote(engine)
    engine.close()
