"""Issue 27, item 4: the client keeps its contract when the daemon is overloaded. Against a real
daemon whose Redis tier is paused (SIGSTOP of a real redis-server), store calls pass their deadline
(503) and then hit the cap on abandoned calls (503 at once): `put_many` names every chunk in
`not_stored` with the daemon's reason and `get_many` and `lookup` miss, over shared memory and
over HTTP alike, and no exception reaches the caller."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from connector.client import KVStoreClient
from service.process import Daemon, write_config
from tests.cluster.conftest import MISSING, REDIS_BINARY, free_port
from tests.cluster.test_abandoned_calls import _wait_for_redis
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, TOKENS

pytestmark = pytest.mark.redis
ADMIN = "overload-admin-token-0123456"
CAP = 3
Stalled = tuple[subprocess.Popen[bytes], Daemon]


@pytest.fixture(scope="module")
def stalled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stalled]:
    """A redis-server and a daemon with a Redis tier under a 16-chunk host tier; tenant a (shared
    memory, a quota of 2 chunks: its next put first deletes one, which asks Redis) and tenant b
    (HTTP). Deadlines of 0.3 s and 0.5 s, at most CAP abandoned calls."""
    if REDIS_BINARY is None:
        pytest.skip(MISSING)
    root = tmp_path_factory.mktemp("overload")
    port = free_port()
    proc = subprocess.Popen([REDIS_BINARY, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(root)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait_for_redis(port)
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True,
                "quota": {"host": 2 * LAYOUT.chunk_bytes}},
               {"name": "b", "token": TOKENS["b"], "salt": "salt-b", "shm": False}]
    config = write_config(root, layout=LAYOUT, host_chunks=16, nvme_chunks=0, tenants=tenants,
                          service={"admin_token": ADMIN, "request_timeout_s": 0.3, "max_abandoned_calls": CAP})
    text = config.read_text().replace("put_timeout_s = 3.0", "put_timeout_s = 0.5")
    config.write_text(text + f'[[tiers]]\nkind = "redis"\ncapacity = "{64 * LAYOUT.chunk_bytes}B"\n'
                             f'options = {{ url = "redis://127.0.0.1:{port}/0", socket_timeout_s = 60.0, prefix = "ov" }}\n')
    daemon = Daemon(config, root / "daemon.log").start()
    yield proc, daemon
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
    daemon.close()
    proc.kill()
    proc.wait()


def _service(daemon: Daemon) -> dict[str, Any]:
    stats = httpx.get(f"{daemon.url}/v1/stats", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).json()
    return stats["service"]  # type: ignore[no-any-return]


def _outs(n: int) -> list[torch.Tensor]:
    return [torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype) for _ in range(n)]


def _pushed_down(b: KVStoreClient) -> list[bytes]:
    """b's first 20 chunks, most of them pushed out of the 16-chunk host tier by the 12 put after
    them: a get of all 20 reads Redis for some."""
    keys = b.chunk_keys(list(range(32 * LAYOUT.chunk_tokens)))
    for i in range(0, 32, 4):
        assert b.put_many(keys[i:i + 4], [make_chunk(LAYOUT, 100 + j) for j in range(i, i + 4)]).stored
    return keys[:20]


def test_a_paused_redis_and_the_abandoned_call_cap_give_not_stored_and_misses(stalled: Stalled) -> None:
    proc, daemon = stalled
    with KVStoreClient(daemon.url, token=TOKENS["a"], use_shm=True, timeout_s=30) as a, \
            KVStoreClient(daemon.url, token=TOKENS["b"], use_shm=False, timeout_s=30) as b:
        assert a.use_shm and not b.use_shm
        keys = a.chunk_keys(list(range(6 * LAYOUT.chunk_tokens)))
        assert a.put_many(keys[:2], [make_chunk(LAYOUT, 1), make_chunk(LAYOUT, 2)]).ok  # a's quota is full
        cold = _pushed_down(b)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            late = a.put_many([keys[2]], [make_chunk(LAYOUT, 3)])  # its quota victim's delete waits on Redis
            assert not late.stored and "did not answer" in late.not_stored[keys[2]], late
            for _ in range(2):  # each read waits on Redis: 503, a miss
                assert b.get_many(cold, _outs(20)) == [False] * 20
            assert _service(daemon)["abandoned_calls"] == CAP  # the put and b's two reads still run
            refused = a.put_many(keys[3:5], [make_chunk(LAYOUT, 4), make_chunk(LAYOUT, 5)])
            assert not refused.stored and set(refused.not_stored) == set(keys[3:5])
            assert all("max_abandoned_calls" in reason for reason in refused.not_stored.values()), refused
            http_refused = b.put_many(keys[5:6], [make_chunk(LAYOUT, 6)])
            assert "max_abandoned_calls" in http_refused.not_stored[keys[5]]
            assert a.get_many(keys[:2], _outs(2)) == [False, False]  # refused at once: misses
            assert b.get_many(cold, _outs(20)) == [False] * 20
            assert a.lookup_keys(keys) <= 2 and not a.remove(keys[0])
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            _drain(daemon)
        assert a.get_many(keys[:1], _outs(1)) in ([True], [False])  # serving again, whatever the quota kept


def _drain(daemon: Daemon) -> None:
    import time

    end = time.monotonic() + 60
    while _service(daemon)["abandoned_calls"] and time.monotonic() < end:
        time.sleep(0.1)
    assert _service(daemon)["abandoned_calls"] == 0
