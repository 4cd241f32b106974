"""The isolated shared-memory plane on a real daemon: a tenant maps only its own segment, gets
another's descriptor by no path, cannot change a stored chunk by writing its segment after the
put, and nothing of the daemon's memory has a name in /dev/shm."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from connector.client import KVStoreClient
from connector.client_segment import receive_fd
from kvstore.errors import KVStoreError
from service.process import Daemon
from tests.conftest import make_chunk
from tests.helpers.forkserver import ForkServer
from tests.service.conftest import LAYOUT, TOKENS, start_daemon


@pytest.fixture(scope="module")
def two_tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("segments")
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True},
               {"name": "b", "token": TOKENS["b"], "salt": "salt-b", "shm": True}]
    d = start_daemon(root, host_chunks=32, tenants=tenants)
    yield d
    d.close()


def test_a_tenant_reaches_no_other_tenants_segment(two_tenants: Daemon, fork_server: ForkServer) -> None:
    with KVStoreClient(two_tenants.url, token=TOKENS["a"]) as a:
        assert a.use_shm and a.info.shm_plane == "segments"
        keys = a.chunk_keys(list(range(2 * LAYOUT.chunk_tokens)))
        assert a.put_many(keys, [make_chunk(LAYOUT, 1), make_chunk(LAYOUT, 2)]).ok
        segment = a._segments.segment  # type: ignore[union-attr]
        assert segment is not None
        socket_path = httpx.post(f"{two_tenants.url}/v1/shm/segments", json={"slots": 1},
                                 headers={"Authorization": f"Bearer {TOKENS['a']}"}).json()["socket"]
        # Tenant b, in its own process, tries every way at tenant a's segment (id and socket given to it).
        done = fork_server.run(["-m", "tests.programs.segment_attack", two_tenants.url, TOKENS["b"], segment.id,
                                socket_path, keys[0].hex()], timeout_s=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["404", "404", "refused"]
        with pytest.raises(KVStoreError, match="refused"):
            receive_fd(socket_path, "0" * 32, TOKENS["a"])  # a guessed id gets nothing either
        assert oct(os.stat(socket_path).st_mode & 0o777) == "0o600"


def test_writing_the_segment_after_a_put_changes_nothing_stored(two_tenants: Any) -> None:
    with KVStoreClient(two_tenants.url, token=TOKENS["a"]) as a, \
            KVStoreClient(two_tenants.url, token=TOKENS["a"], use_shm=False) as http:
        keys = a.chunk_keys(list(range(9000, 9000 + 2 * LAYOUT.chunk_tokens)))
        chunks = [make_chunk(LAYOUT, 21), make_chunk(LAYOUT, 22)]
        assert a.put_many(keys, chunks).ok
        assert a._segments.segment is not None  # type: ignore[union-attr]
        a._segments.segment._buffer[:] = 0xAB  # type: ignore[union-attr]  # scribble over every slot, as a buggy or hostile client could
        for key, chunk in zip(keys, chunks, strict=True):
            out = torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
            assert http.get(key, out) and torch.equal(out, chunk)
            out2 = torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
            assert a.get(key, out2) and torch.equal(out2, chunk)


def test_bad_slots_and_no_named_memory(two_tenants: Any) -> None:
    with KVStoreClient(two_tenants.url, token=TOKENS["b"]) as b:
        assert b._segments.segment is not None  # type: ignore[union-attr]
        auth = {"Authorization": f"Bearer {TOKENS['b']}"}
        key = b.chunk_keys(list(range(LAYOUT.chunk_tokens)))[0].hex()
        for slots in ([b._segments.segment.slots], [-1], [0, 0], ["0"], []):  # type: ignore[union-attr]
            reply = httpx.post(f"{two_tenants.url}/v1/shm/segments/get", headers=auth,
                               json={"segment": b._segments.segment.id, "keys": [key] * max(1, len(slots)), "slots": slots})  # type: ignore[union-attr]
            assert reply.status_code == 400, (slots, reply.text)
    assert two_tenants.proc is not None
    assert not [n for n in os.listdir("/dev/shm") if str(two_tenants.proc.pid) in n]


def test_a_batch_larger_than_the_segment_still_fits_after_a_failed_call_dropped_it(tmp_path: Path) -> None:
    """A timed-out call drops the staging segment (the daemon may still use its slots); the next batch
    of more chunks than the segment has slots must still go in slot-sized pieces, not fail."""
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True}]
    d = start_daemon(tmp_path, host_chunks=256, tenants=tenants)
    try:
        with KVStoreClient(d.url, token=TOKENS["a"], timeout_s=1.0) as a:
            slots = a._segments.batch_slots()  # type: ignore[union-attr]
            n = slots + slots // 2 + 1
            keys = a.chunk_keys(list(range(n * LAYOUT.chunk_tokens)))
            chunks = [make_chunk(LAYOUT, 900 + i) for i in range(n)]
            assert a.put_many(keys[:1], chunks[:1]).ok and a._segments.segment is not None  # type: ignore[union-attr]
            os.kill(d.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]  # a stalled daemon: the call times out for real
            try:
                failed = a.put_many(keys[1:2], chunks[1:2])
            finally:
                os.kill(d.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
            assert not failed.ok and a._segments.segment is None  # type: ignore[union-attr]  # reported, and the segment dropped
            assert a.put_many(keys, chunks).ok
            outs = [torch.empty_like(c) for c in chunks]
            assert all(a.get_many(keys, outs))
            assert all(torch.equal(o, c) for o, c in zip(outs, chunks, strict=True))
    finally:
        d.close()
