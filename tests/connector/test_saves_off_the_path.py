"""A frozen daemon (SIGSTOP) never holds an engine's step: the vLLM connector's worker half (PagedTransfer, no
vLLM) over a real `kvstore serve` and a real KVStoreClient. A step's save returns while the daemon is frozen,
the first save timeout opens the breaker, a handoff's load stops waiting once the breaker is open, and the
client's chunk pool, refused while the daemon was frozen, is opened again once it answers."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from connector.client import KVStoreClient
from connector.deadlines import Deadlines
from connector.vllm.paged import PagedKind
from connector.vllm.plan import TransferSpec
from connector.vllm.transfer import PagedTransfer
from service.process import Daemon
from tests.connector.test_vllm_plan_transfer import BLOCK, CHUNK, LAYOUT, caches
from tests.helpers.waits import wait_until
from tests.service.conftest import start_daemon

# Control calls (a segment's open among them) get far longer than any wait below: a step that waited for the
# daemon would still be waiting when the test looks.
SOCKET_S = 120.0
DEADLINES = Deadlines(lookup_timeout_s=0.3, load_timeout_s=0.5, save_timeout_s=0.5, control_timeout_s=SOCKET_S,
                      breaker_cooldown_s=0.2)
PROMPT = list(range(500, 500 + 3 * CHUNK))  # three whole chunks
BLOCKS = tuple(range(3 * CHUNK // BLOCK))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("off_the_path"), layout=LAYOUT, host_chunks=64)
    yield d
    d.close()


@pytest.fixture
def store(daemon: Daemon) -> Iterator[KVStoreClient]:
    guarded = KVStoreClient(daemon.url, deadlines=DEADLINES, name="test")
    yield guarded
    guarded.close()


def frozen(daemon: Daemon) -> Callable[[], None]:
    """SIGSTOP the daemon; the returned function sends SIGCONT."""
    assert daemon.proc is not None
    pid = daemon.proc.pid
    os.kill(pid, signal.SIGSTOP)
    return lambda: os.kill(pid, signal.SIGCONT)


def spec_of(store: KVStoreClient, prompt: list[int], wait_s: float = 0.0) -> TransferSpec:
    keys = tuple(store.chunk_keys(prompt))
    return TransferSpec("r", keys, first_chunk=0, start_token=0, end_token=len(prompt), block_ids=BLOCKS,
                        wait_s=wait_s)


def returns_while_frozen(fn: Callable[[], object]) -> bool:
    """Run `fn` on a thread; True when it returned long before the daemon could have answered (SOCKET_S)."""
    done = threading.Thread(target=fn, daemon=True)
    done.start()
    done.join(SOCKET_S / 4)
    return not done.is_alive()


def test_a_steps_save_returns_while_the_daemon_is_frozen(daemon: Daemon, store: KVStoreClient) -> None:
    """Regression (issue 43): vLLM's first request with a frozen daemon took 20 s. The step's save gathered its
    chunks into empty_chunk(), whose first call opened the client's chunk pool over HTTP, on the step, under the
    client's socket timeout; the pool is now opened in the background and the chunk is ordinary memory till then."""
    transfer = PagedTransfer(store, caches(seed=1), PagedKind.HEAD_PLANES, BLOCK)
    spec = spec_of(store, PROMPT)
    thaw = frozen(daemon)
    try:
        assert returns_while_frozen(lambda: transfer.save([spec])), "the step waited for the frozen daemon"
        assert wait_until(lambda: store.breaker.is_open, 30.0), "the first save timeout opens the breaker"
        assert store.counters["save_timeouts"] == 1 and store.counters["breaker_opened"] == 1
        assert store.counters["lookup_timeouts"] == 0, "a save alone opened it"
    finally:
        thaw()

    def saved() -> bool:
        transfer.save([spec])
        transfer.wait()
        return store.lookup_keys(spec.keys) == len(spec.keys)

    assert wait_until(saved, 60.0, poll_s=0.2), "saves store again once the daemon answers"


def test_a_handoff_load_stops_waiting_once_the_store_does_not_answer(daemon: Daemon, store: KVStoreClient) -> None:
    """A decode instance's load waits up to handoff_wait_s for announced chunks; a frozen daemon ends that wait
    with the first lookup past its budget (the breaker opens), and the load fails its blocks for vLLM to recompute."""
    loader = PagedTransfer(store, caches(), PagedKind.HEAD_PLANES, BLOCK)
    spec = spec_of(store, list(range(9000, 9000 + 3 * CHUNK)), wait_s=SOCKET_S / 2)
    failed: list[set[int]] = []
    thaw = frozen(daemon)
    try:
        assert returns_while_frozen(lambda: failed.append(loader.load(spec))), "the load waited out handoff_wait_s"
    finally:
        thaw()
    assert failed == [set(BLOCKS)] and store.counters["lookup_timeouts"] == 1 and store.breaker.times_opened == 1
    assert loader.counters["handoff_wait_seconds"] < spec.wait_s


def test_a_pool_refused_while_frozen_opens_once_the_daemon_answers(daemon: Daemon) -> None:
    """The pool's open failed (the socket timed out on the frozen daemon): empty_chunk() gives ordinary memory
    meanwhile, and the pool is tried again later instead of never."""
    with KVStoreClient(daemon.url, timeout_s=0.5) as client:
        segments = client._segments
        assert segments is not None
        thaw = frozen(daemon)
        try:
            plain = client.empty_chunk()  # starts the open in the background
            assert not segments.wait_pool(2.0), "no pool from a frozen daemon"
            assert plain.shape == LAYOUT.chunk_shape
        finally:
            thaw()

        def pooled() -> bool:
            chunk = client.empty_chunk()
            return segments.pool is not None and segments.pool.slot_of(chunk.view(torch.uint8).reshape(-1)) is not None

        assert wait_until(pooled, 30.0, poll_s=0.1), "the pool is opened again once the daemon answers"


def test_saves_are_counted_when_the_store_does_not_take_them(tmp_path: Path) -> None:
    """A queued save the daemon cannot take (it is gone) is counted, not raised: the caller never waited for it."""
    gone = start_daemon(tmp_path, layout=LAYOUT, host_chunks=16)
    store = KVStoreClient(gone.url, deadlines=DEADLINES, name="test")
    try:
        gone.kill()
        keys = store.chunk_keys(PROMPT)
        chunks = [torch.ones(LAYOUT.chunk_shape) for _ in keys]
        assert store.save_async(keys, chunks) == len(keys)
        store.wait_saves()
        assert store.counters["unsaved_chunks"] == len(keys)
    finally:
        store.close()
        gone.close()
