"""One real daemon started with no [layout] serves two models of different layouts (heads, dtype, chunk tokens):
each client registers its layout (POST /v1/layouts), hits its own prefixes and none of the other's, and reads its
bytes back exact, over shared memory and HTTP, before and after a restart from NVMe; a conflicting registration
and a daemon fixed to another layout are refused with both layouts named."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from connector.client import KVStoreClient
from kvstore.errors import LayoutMismatchError
from kvstore.kv_scope import ModelIdentity
from kvstore.layout import KVLayout
from service.exposition import parse_samples
from service.process import Daemon
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, start_daemon

# Model A is the suite's test layout (float32, 2 kv heads x 16, 16-token chunks: 8 KiB); model B differs in
# every field a client could get wrong (3 layers, 4 kv heads x 8, bfloat16, 8-token chunks: 3 KiB).
LAYOUT_B = KVLayout(num_layers=3, num_kv_heads=4, head_dim=8, dtype="bfloat16", chunk_tokens=8)
MODELS = {"model-a": LAYOUT, "model-b": LAYOUT_B}
BUDGET_CHUNKS = 4  # model-c (B's layout) may hold 4 chunks: [service.model_budgets]
PROMPT = list(range(1000, 1064))  # the same 64 tokens for both models: 4 chunks of A, 8 of B


@pytest.fixture(scope="module")
def any_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("any-layout")
    d = start_daemon(root, any_layout=True, host_chunks=64, nvme_chunks=128,
                     service={"model_budgets": {"model-c": BUDGET_CHUNKS * LAYOUT_B.chunk_bytes}})
    yield d
    d.close()


def _client(daemon: Daemon, model: str, *, use_shm: bool | None = None) -> KVStoreClient:
    return KVStoreClient(daemon.url, model=model, layout=_layout(model), use_shm=use_shm)


def _layout(model: str) -> KVLayout:
    return MODELS.get(model, LAYOUT_B)


def _keys(client: KVStoreClient, model: str, tokens: list[int]) -> list[bytes]:
    layout = _layout(model)
    scope = ModelIdentity(model=model, kv_dtype=layout.dtype, layout_fingerprint=layout.fingerprint).scope()
    return client.chunk_keys(tokens, scope)


def _chunks(model: str, n: int, seed: int) -> list[torch.Tensor]:
    return [make_chunk(_layout(model), seed + i) for i in range(n)]


def _read(client: KVStoreClient, keys: list[bytes]) -> tuple[list[bool], list[torch.Tensor]]:
    outs = [client.empty_chunk() for _ in keys]
    return client.get_many(keys, outs), outs


def _put_and_check(daemon: Daemon, seed: int, *, use_shm: bool | None) -> dict[str, tuple[list[bytes], list[torch.Tensor]]]:
    clients = {model: _client(daemon, model, use_shm=use_shm) for model in MODELS}
    written = {}
    try:
        for model, client in clients.items():
            tokens = [t + seed for t in PROMPT]
            keys = _keys(client, model, tokens)
            assert client.lookup_keys(keys) == 0  # the other model's chunks of the same tokens are no hit
            chunks = _chunks(model, len(keys), seed)
            assert client.put_many(keys, chunks).ok
            written[model] = (keys, chunks)
        for model, client in clients.items():
            keys, chunks = written[model]
            assert client.lookup_keys(keys) == len(keys)
            found, outs = _read(client, keys)
            assert all(found) and all(torch.equal(a, b) for a, b in zip(outs, chunks, strict=True))
            other = next(m for m in MODELS if m != model)
            other_keys = written[other][0][: len(keys)]
            assert client.get_many(other_keys, [client.empty_chunk() for _ in other_keys]) == [False] * len(other_keys)
    finally:
        for client in clients.values():
            client.close()
    return written


@pytest.mark.parametrize("use_shm", [None, False], ids=["shared-memory", "http"])
def test_two_layouts_one_daemon_each_hits_its_own(any_daemon: Daemon, use_shm: bool | None) -> None:
    _put_and_check(any_daemon, seed=0 if use_shm is None else 5000, use_shm=use_shm)


def test_per_model_metrics_count_each_model_in_its_own_tokens(any_daemon: Daemon) -> None:
    _put_and_check(any_daemon, seed=9000, use_shm=None)
    text = httpx.get(f"{any_daemon.url}/metrics").text

    def sample(name: str, model: str) -> float:
        found = [v for (n, labels), v in parse_samples(text).items() if n == name and ("model", model) in labels]
        assert len(found) == 1, name
        return found[0]

    for model, layout in MODELS.items():
        hit_chunks = sample("kvstore_model_lookup_hit_chunks_total", model)
        assert hit_chunks > 0
        assert sample("kvstore_model_lookup_hit_tokens_total", model) == hit_chunks * layout.chunk_tokens


def test_a_models_budget_caps_its_own_chunks_not_the_others(any_daemon: Daemon) -> None:
    """model-c may hold 4 chunks: its second put of 4 removes its first 4; model-b (the same layout, no budget)
    keeps all 8 of its own."""
    with _client(any_daemon, "model-c") as budgeted, _client(any_daemon, "model-b") as free:
        keys = _keys(budgeted, "model-c", [t + 20000 for t in PROMPT])  # 8 chunks
        chunks = _chunks("model-c", len(keys), 20000)
        assert budgeted.put_many(keys[:4], chunks[:4]).ok and budgeted.put_many(keys[4:], chunks[4:]).ok
        found, outs = _read(budgeted, keys)
        assert found == [False] * 4 + [True] * 4
        assert all(torch.equal(a, b) for a, b in zip(outs[4:], chunks[4:], strict=True))
        assert not budgeted.put_many(keys, chunks).ok  # 8 chunks at once cannot fit a 4-chunk budget: 429
        other = _keys(free, "model-b", [t + 20000 for t in PROMPT])
        assert free.put_many(other, _chunks("model-b", len(other), 1)).ok
        assert free.lookup_keys(other) == len(other)


def test_a_conflicting_registration_is_refused_naming_both(any_daemon: Daemon) -> None:
    _client(any_daemon, "model-a").close()
    with pytest.raises(LayoutMismatchError, match=r"'model-a' registered layout .*kv_heads=2.*kv_heads=4.*model_id"):
        KVStoreClient(any_daemon.url, model="model-a", layout=LAYOUT_B)
    _client(any_daemon, "model-a").close()  # the same layout again is welcome
    stage = dataclasses.replace(LAYOUT, num_layers=LAYOUT.num_layers + 1)  # another pipeline stage's layers
    KVStoreClient(any_daemon.url, model="model-a", layout=stage).close()


def test_a_daemon_fixed_to_one_layout_refuses_another(daemon: Daemon) -> None:
    with pytest.raises(LayoutMismatchError, match=r"serves one layout.*kv_heads=4.*no \[layout\]"):
        KVStoreClient(daemon.url, model="model-b", layout=LAYOUT_B)
    KVStoreClient(daemon.url, model="model-a", layout=LAYOUT).close()  # its own layout registers fine


def test_restart_reads_every_layout_back_from_nvme(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, any_layout=True, host_chunks=64, nvme_chunks=128)
    try:
        written = _put_and_check(d, seed=0, use_shm=None)
        assert d.stop() == 0  # a clean drain: every put was durable before its answer anyway
        d.start()
        for model, (keys, chunks) in written.items():
            with _client(d, model) as client:
                assert client.lookup_keys(keys) == len(keys)
                found, outs = _read(client, keys)
                assert all(found) and all(torch.equal(a, b) for a, b in zip(outs, chunks, strict=True)), model
    finally:
        d.close()


def test_a_client_registers_again_after_a_memory_only_daemon_restarts(tmp_path: Path) -> None:
    """No disk tier keeps the registrations: the restarted daemon answers UnregisteredLayoutError, the client
    registers again by itself and its calls go on (misses first: memory held the chunks)."""
    d = start_daemon(tmp_path, any_layout=True, host_chunks=64, nvme_chunks=0)
    try:
        with _client(d, "model-b") as client:
            keys = _keys(client, "model-b", PROMPT)
            chunks = _chunks("model-b", len(keys), 1)
            assert client.put_many(keys, chunks).ok
            assert d.stop() == 0
            d.start()
            reply = httpx.post(f"{d.url}/v1/lookup", json={"keys": [], "layout": client.layout_fingerprint})
            assert reply.status_code == 422 and reply.json()["error"] == "UnregisteredLayoutError"
            assert client.lookup_keys(keys) == 0
            assert client.put_many(keys, chunks).ok
            found, outs = _read(client, keys)
            assert all(found) and all(torch.equal(a, b) for a, b in zip(outs, chunks, strict=True))
    finally:
        d.close()
