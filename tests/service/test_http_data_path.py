"""The HTTP data path against a real daemon: chunk bytes land in the caller's buffers in place
(recv_into), with misses in the batch, over a reused keep-alive connection, and over a unix socket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from connector.client import KVStoreClient
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, start_daemon


def test_http_get_fills_the_destination_buffers_in_place(daemon: Any) -> None:
    with KVStoreClient(daemon.url, use_shm=False) as client:
        tokens = list(range(97_000_000, 97_000_000 + 3 * LAYOUT.chunk_tokens))  # no other test uses these
        keys = client.chunk_keys(tokens)
        chunks = [make_chunk(LAYOUT, 300 + i) for i in range(3)]
        assert client.put_many([keys[0], keys[2]], [chunks[0], chunks[2]]).ok
        pool = torch.full((4, *LAYOUT.chunk_shape), 7, dtype=LAYOUT.torch_dtype)  # an engine's block pool
        outs = [pool[1], pool[2], pool[3]]
        pointers = [out.data_ptr() for out in outs]
        for _ in range(3):  # the same keep-alive connection serves every round
            assert client.get_many(keys, outs) == [True, False, True]
            assert torch.equal(pool[1], chunks[0]) and torch.equal(pool[3], chunks[2])
            assert (pool[2] == 7).all() and (pool[0] == 7).all()  # a miss and its neighbour untouched
        assert [out.data_ptr() for out in outs] == pointers
        assert client.lookup(tokens) == LAYOUT.chunk_tokens  # control calls share that connection fine


def test_http_get_over_a_unix_socket(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, uds=tmp_path / "kv.sock")
    try:
        with KVStoreClient(d.url, use_shm=False) as client:
            keys = client.chunk_keys(list(range(2 * LAYOUT.chunk_tokens)))
            chunks = [make_chunk(LAYOUT, 400 + i) for i in range(2)]
            assert client.put_many(keys, chunks).ok
            outs = [torch.empty_like(c) for c in chunks]
            assert client.get_many(keys, outs) == [True, True]
            assert all(torch.equal(a, b) for a, b in zip(outs, chunks, strict=True))
    finally:
        d.stop()
