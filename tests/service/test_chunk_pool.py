"""`KVStoreClient.empty_chunk()` buffers in the client's own pool segment, on a real daemon: the
daemon copies straight into them (one copy), bytes are identical, slots come back when the tensors
are freed, an exhausted pool (or one not open yet) falls back to ordinary memory, and no other tenant
reaches the pool."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from connector.client import KVStoreClient
from connector.plugin_store import load_buffer, owned_buffer
from kvstore.wire_types import SegmentAnswer, SegmentRequest
from service.process import Daemon
from tests.conftest import make_chunk
from tests.helpers.forkserver import ForkServer
from tests.service.conftest import LAYOUT, TOKENS, start_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("pool")
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True},
               {"name": "b", "token": TOKENS["b"], "salt": "salt-b", "shm": True}]
    d = start_daemon(root, host_chunks=32, tenants=tenants)
    yield d
    d.close()


def _keys(client: KVStoreClient, start: int, n: int) -> list[bytes]:
    return client.chunk_keys(list(range(start, start + n * LAYOUT.chunk_tokens)))


def pooled(client: KVStoreClient) -> KVStoreClient:
    """The client once its pool is open: empty_chunk() opens it in the background and never waits for it."""
    assert client._segments is not None and client._segments.wait_pool(30.0)
    return client


def test_pool_buffers_take_one_copy_and_hold_identical_bytes(daemon: Any) -> None:
    with KVStoreClient(daemon.url, token=TOKENS["a"]) as a, \
            KVStoreClient(daemon.url, token=TOKENS["a"], use_shm=False) as http:
        pooled(a)
        keys = _keys(a, 0, 3)
        chunks = [make_chunk(LAYOUT, 40 + i) for i in range(3)]
        sources = [a.empty_chunk() for _ in chunks]
        for source, chunk in zip(sources, chunks, strict=True):
            source.copy_(chunk)
        assert a._segments.pool is not None and all(a._segments.pool.slot_of(s.view(torch.uint8).reshape(-1)) is not None  # type: ignore[union-attr]
                                           for s in sources)
        assert a._segments.segment is not None  # type: ignore[union-attr]
        a._segments.segment._buffer[:] = 0x5A  # type: ignore[union-attr]  # the staging segment: the pooled path never touches it
        assert a.put_many(keys, sources).ok
        sources[0].fill_(0)  # writing a pool buffer after the put changes nothing stored
        outs = [a.empty_chunk() for _ in chunks]
        assert a.get_many(keys, outs) == [True] * 3
        assert all(torch.equal(out, chunk) for out, chunk in zip(outs, chunks, strict=True))
        assert bool((torch.from_numpy(a._segments.segment._buffer) == 0x5A).all())  # type: ignore[union-attr]  # one copy each way
        plain = torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
        assert http.get(keys[0], plain) and torch.equal(plain, chunks[0])
        miss = a.empty_chunk()
        assert a.get_many(_keys(a, 77_000, 1), [miss]) == [False]


def test_slots_come_back_and_an_exhausted_pool_falls_back(daemon: Any) -> None:
    with KVStoreClient(daemon.url, token=TOKENS["a"]) as a:
        first = pooled(a).empty_chunk()
        pool = a._segments.pool  # type: ignore[union-attr]
        assert pool is not None and pool.in_use() == 1
        held = [first] + [a.empty_chunk() for _ in range(pool.segment.slots - 1)]
        assert pool.in_use() == pool.segment.slots
        extra = a.empty_chunk()  # the pool is used up: ordinary memory
        assert pool.slot_of(extra.view(torch.uint8).reshape(-1)) is None
        keys = _keys(a, 5000, 2)
        chunks = [make_chunk(LAYOUT, 60), make_chunk(LAYOUT, 61)]
        assert a.put_many(keys, chunks).ok
        outs = [held[-1], extra]  # one pooled, one not: both filled
        assert a.get_many(keys, outs) == [True, True]
        assert torch.equal(outs[0], chunks[0]) and torch.equal(outs[1], chunks[1])
        view = held[3].view(torch.uint8)  # a view keeps the slot taken after the tensor itself goes
        del held, outs, first
        gc.collect()
        assert pool.in_use() == 1
        del view
        gc.collect()
        assert pool.in_use() == 0
        again = [a.empty_chunk() for _ in range(pool.segment.slots)]
        assert pool.in_use() == pool.segment.slots and a._segments.pool is pool  # type: ignore[union-attr]  # reused, never grown
        del again


def test_another_tenant_cannot_reach_the_pool(daemon: Daemon, fork_server: ForkServer) -> None:
    with KVStoreClient(daemon.url, token=TOKENS["a"]) as a:
        keys = _keys(a, 9000, 1)
        buf = pooled(a).empty_chunk()
        buf.copy_(make_chunk(LAYOUT, 70))
        assert a.put_many(keys, [buf]).ok and a._segments.pool is not None  # type: ignore[union-attr]
        socket_path = a._http.call("POST", "/v1/shm/segments", SegmentRequest(slots=1), SegmentAnswer).socket  # type: ignore[union-attr]
        done = fork_server.run(["-m", "tests.programs.segment_attack", daemon.url, TOKENS["b"],
                                a._segments.pool.segment.id, socket_path, keys[0].hex()], timeout_s=60)  # type: ignore[union-attr]
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["404", "404", "refused"]
        with KVStoreClient(daemon.url, token=TOKENS["b"]) as b:
            out = pooled(b).empty_chunk()
            assert b.get_many(keys, [out]) == [False]  # b's keys are salted apart, its pool is its own
            assert b._segments.pool is not None and b._segments.pool.segment.id != a._segments.pool.segment.id  # type: ignore[union-attr]


def test_engine_plugins_buffers_are_pool_slots(daemon: Any) -> None:
    """What the vLLM, LMCache and SGLang plugins use (connector/plugin_store.py): under the engine's
    inference_mode, a load buffer is a pool slot; an engine's chunk is saved from one (a copy); the staging
    segment (the two-copy path) is never touched, and the bytes come back identical."""
    with KVStoreClient(daemon.url, token=TOKENS["a"]) as a:
        pooled(a)
        keys = _keys(a, 12_000, 2)
        chunks = [make_chunk(LAYOUT, 80), make_chunk(LAYOUT, 81)]
        engine_cache = torch.stack([c.transpose(0, 1).contiguous() for c in chunks])  # LMCache's [2, layers, ...]
        views = [engine_cache[i].transpose(0, 1) for i in range(2)]  # kvstore's order: strided views
        assert not views[0].is_contiguous()
        with torch.inference_mode():
            staged = [owned_buffer(a, v) for v in views]
            outs = [load_buffer(a) for _ in keys]
        assert a._segments.pool is not None  # type: ignore[union-attr]
        assert all(a._segments.pool.slot_of(t.view(torch.uint8).reshape(-1)) is not None for t in staged + outs)  # type: ignore[union-attr]
        assert not any(t.is_inference() for t in outs)
        assert owned_buffer(a, chunks[0]).data_ptr() != chunks[0].data_ptr()  # contiguous too: the engine reuses its own
        assert a._segments.segment is not None  # type: ignore[union-attr]
        a._segments.segment._buffer[:] = 0x5A  # type: ignore[union-attr]
        assert a.put_many(keys, staged).ok
        assert a.get_many(keys, outs) == [True, True]
        assert all(torch.equal(out, chunk) for out, chunk in zip(outs, chunks, strict=True))
        assert bool((torch.from_numpy(a._segments.segment._buffer) == 0x5A).all())  # type: ignore[union-attr]  # one copy each way
