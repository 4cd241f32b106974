"""Crash safety: clients write under load, the daemon is SIGKILLed mid-stream and restarted. Every
acknowledged chunk reads back intact; an unacknowledged one is either absent or intact, never torn."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from connector.client import KVStoreClient
from kvstore.chunk_format import PAYLOAD_OFFSET, ChunkHeader, verify_payload
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, start_daemon

NUM_WRITERS = 3
KILL_AFTER_ACKS = 40


def _writer(url: str, writer_id: int, use_shm: bool, acked: dict, tried: dict, lock: threading.Lock,
            stop: threading.Event) -> None:
    with KVStoreClient(url, use_shm=use_shm) as client:
        with lock:
            tried[b"started-%d" % writer_id] = -1  # connected: the kill waits for every writer
        for batch in range(10_000):
            if stop.is_set():
                return
            tokens = list(range((writer_id * 10_000 + batch) * 100, (writer_id * 10_000 + batch) * 100 + 2 * LAYOUT.chunk_tokens))
            keys = client.chunk_keys(tokens)
            seeds = [writer_id * 1_000_000 + batch * 2 + i for i in range(2)]
            with lock:
                tried.update(zip(keys, seeds, strict=True))
            result = client.put_many(keys, [make_chunk(LAYOUT, s) for s in seeds])  # a dead daemon = not stored
            with lock:
                acked.update({k: tried[k] for k in result.stored})
            if result.not_stored and stop.is_set():
                return


def test_sigkill_under_load_loses_no_acknowledged_chunk(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, host_chunks=16, nvme_chunks=1024)
    acked: dict[bytes, int] = {}
    tried: dict[bytes, int] = {}
    lock, stop = threading.Lock(), threading.Event()
    threads = [threading.Thread(target=_writer, args=(daemon.url, i, i == 0, acked, tried, lock, stop))
               for i in range(NUM_WRITERS)]
    try:
        for t in threads:
            t.start()
        def connected() -> int:
            with lock:
                return sum(k.startswith(b"started-") for k in tried)

        while (len(acked) < KILL_AFTER_ACKS or connected() < NUM_WRITERS) and any(t.is_alive() for t in threads):
            threading.Event().wait(0.01)
        daemon.kill()  # SIGKILL while the writers are mid-request
        stop.set()
        for t in threads:
            t.join(timeout=60)
        with lock:
            acked_now = dict(acked)
            tried_now = {k: v for k, v in tried.items() if not k.startswith(b"started-")}
        assert len(acked_now) >= KILL_AFTER_ACKS and len(tried_now) > len(acked_now) - 1
        _assert_files_whole(tmp_path / "nvme")
        daemon.start()
        with KVStoreClient(daemon.url, use_shm=False) as client:
            keys = list(tried_now)
            outs = [torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype) for _ in keys]
            found = client.get_many(keys, outs)
            for key, ok, out in zip(keys, found, outs, strict=True):
                if key in acked_now:
                    assert ok, f"acknowledged chunk {key.hex()} lost"
                if ok:
                    assert torch.equal(out, make_chunk(LAYOUT, tried_now[key])), f"chunk {key.hex()} torn"
            stats = client.stats()
            assert stats["tiers"]["nvme"]["corrupt"] == 0 and stats["recovered_chunks"] >= len(acked_now)
    finally:
        stop.set()
        daemon.close()


def _assert_files_whole(root: Path) -> None:
    """Every published chunk file on disk has a valid header and payload checksum."""
    files = list(root.rglob("*.kvc"))
    assert files
    for path in files:
        data = path.read_bytes()
        header = ChunkHeader.unpack(data)
        verify_payload(header, data[PAYLOAD_OFFSET:PAYLOAD_OFFSET + header.stored_bytes])
