"""LMCache 0.5.6 (its own LMCacheEngine, on CPU) with the kvstore remote storage plugin and a real daemon.

A CPU stand-in for the GPU connector copies between a flat [2, layers, tokens, heads*dim] KV tensor
(LMCache's own KV_2LTD format) and LMCache's buffers; everything else is LMCache's code: its token
database, storage manager, remote backend, plugin loading and serde.
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
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface
from lmcache.v1.metadata import LMCacheMetadata

from connector.client import KVStoreClient
from connector.lmcache.plugin import live_connectors, require_remote
from kvstore.errors import KVStoreError
from tests.integration.conftest import llama_layout

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
CHUNK, LAYERS, HEADS, DIM, NUM_CHUNKS = 64, 2, 2, 32, 4
_ids = itertools.count()


class FlatKVConnector(GPUConnectorInterface):
    """LMCache's GPU connector contract on CPU: `kv` (kwarg) is [2, layers, tokens, heads*dim]."""

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        memory_obj.tensor.copy_(kwargs["kv"][:, :, start:end])

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        kwargs["kv"][:, :, start:end].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(obj, start, end, **kwargs)

    def batched_to_gpu(self, memory_objs: Any = None, starts: Any = None, ends: Any = None, **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(obj, start, end, **kwargs)

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, LAYERS, num_tokens, HEADS * DIM])


def make_engine(url: str, hash_algorithm: str = "sha256_cbor", **options: object) -> Any:
    """An LMCache engine on the kvstore plugin (a prefix hash that is the same in every process); `options`: more
    of the plugin's keys (e.g. its deadlines)."""
    plugin = {f"remote_storage_plugin.kvstore.{name}": value for name, value in options.items()}
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.05, save_unfull_chunk=False, remote_serde="naive",
        pre_caching_hash_algorithm=hash_algorithm,
        remote_storage_plugins=["kvstore"],
        extra_config={"remote_storage_plugin.kvstore.module_path": "connector.lmcache.plugin",
                      "remote_storage_plugin.kvstore.class_name": "KVStoreRemoteConnector",
                      "remote_storage_plugin.kvstore.url": url, **plugin})
    metadata = LMCacheMetadata(model_name="tiny-llama", world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.float32, kv_shape=(LAYERS, 2, CHUNK, HEADS, DIM),
                               chunk_size=CHUNK)
    engine = LMCacheEngineBuilder.get_or_create(f"kvstore-test-{next(_ids)}", config, metadata, FlatKVConnector(),
                                                lambda t, r: None, lambda o, r: o)
    engine.post_init()
    return engine


def tokens(seed: int, n: int = NUM_CHUNKS * CHUNK) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 30000, (n,), generator=gen).tolist()


def kv(seed: int, n: int = NUM_CHUNKS * CHUNK) -> torch.Tensor:
    return torch.randn(2, LAYERS, n, HEADS * DIM, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def daemon(daemon_factory: Any) -> Any:
    return daemon_factory(llama_layout(CHUNK, num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM))


def test_store_then_a_fresh_engine_retrieves_byte_identical_kv(daemon: Any) -> None:
    prompt, source = tokens(1), kv(1)
    writer = make_engine(daemon.url)
    require_remote(writer)
    writer.store(prompt, kv=source)
    wait_stored(daemon.url, NUM_CHUNKS)
    reader = make_engine(daemon.url)
    require_remote(reader)
    assert reader.lookup(prompt) == NUM_CHUNKS * CHUNK
    target = torch.zeros_like(source)
    mask = reader.retrieve(prompt, kv=target)
    assert int(mask.sum()) == NUM_CHUNKS * CHUNK
    assert torch.equal(target.view(torch.int32), source.view(torch.int32)), "byte-identical KV"
    (plugin,) = [c for c in live_connectors() if c.counters["get_hits"]]
    assert plugin.counters["get_hits"] == NUM_CHUNKS and plugin.is_alive()
    for engine in (writer, reader):
        engine.close()


def test_a_prompt_diverging_in_chunk_k_retrieves_exactly_k_chunks(daemon: Any) -> None:
    prompt = tokens(2)
    writer = make_engine(daemon.url)
    writer.store(prompt, kv=kv(2))
    wait_stored(daemon.url, NUM_CHUNKS)
    reader = make_engine(daemon.url)
    for k in range(NUM_CHUNKS):
        other = list(prompt)
        other[k * CHUNK + 5] += 1  # a different token inside chunk k
        assert reader.lookup(other) == k * CHUNK
        target = torch.zeros(2, LAYERS, len(other), HEADS * DIM)
        assert int(reader.retrieve(other, kv=target).sum()) == k * CHUNK
    for engine in (writer, reader):
        engine.close()


def test_daemon_down_means_misses_not_exceptions(daemon: Any) -> None:
    prompt = tokens(3)
    engine = make_engine(daemon.url)
    engine.store(prompt, kv=kv(3))
    wait_stored(daemon.url, NUM_CHUNKS)
    fresh = make_engine(daemon.url)
    require_remote(fresh)
    daemon.kill()
    assert fresh.lookup(prompt) == 0
    target = torch.zeros(2, LAYERS, len(prompt), HEADS * DIM)
    assert int(fresh.retrieve(prompt, kv=target).sum()) == 0
    fresh.store(tokens(4), kv=kv(4))  # puts fail quietly: the engine keeps serving
    with pytest.raises(KVStoreError, match="does not answer"):
        require_remote(fresh)
    for e in (engine, fresh):
        e.close()


def test_plugin_fails_loudly_and_the_liveness_check_catches_it(daemon: Any, caplog: pytest.LogCaptureFixture) -> None:
    """LMCache swallows a plugin's start-up error; the plugin logs it and require_remote refuses the engine."""
    daemon.kill()
    with caplog.at_level(logging.ERROR, logger="connector.lmcache.plugin"):
        engine = make_engine(daemon.url)
    assert "kvstore LMCache plugin cannot start" in caplog.text
    with pytest.raises(KVStoreError, match="RemoteBackend-kvstore"):
        require_remote(engine)
    engine.close()


def test_plugin_refuses_a_daemon_with_another_layout(daemon_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    other = daemon_factory(llama_layout(CHUNK, num_layers=LAYERS + 1, num_kv_heads=HEADS, head_dim=DIM), name="other")
    with caplog.at_level(logging.ERROR, logger="connector.lmcache.plugin"):
        engine = make_engine(other.url)
    assert "num_layers=2" in caplog.text, "the message names the layout to start the daemon with"
    with pytest.raises(KVStoreError):
        require_remote(engine)
    engine.close()


def wait_stored(url: str, n: int, timeout_s: float = 30.0) -> None:
    """LMCache puts to remote storage asynchronously: wait until the daemon holds n chunks."""
    import time

    deadline = time.monotonic() + timeout_s
    with KVStoreClient(url) as client:
        while client.stats()["chunks"] < n:
            assert time.monotonic() < deadline, f"LMCache stored {client.stats()['chunks']} of {n} chunks"
            time.sleep(0.05)

