"""The engine side's store (EngineStore, here the daemon's KVStoreClient with an engine's deadlines) against a
real daemon frozen by SIGSTOP: lookups, loads and saves miss within their deadlines, the breaker opens (and says so) and closes again after SIGCONT; the save queue drops what it cannot hold;
bad input still raises. (Regression: a stalled daemon held each vLLM request for the client's 60 s timeout.)"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from connector.client import KVStoreClient
from connector.deadlines import Deadlines
from connector.plugin_store import StoreOptions
from kvstore.errors import BadChunkError, ConfigError
from service.process import Daemon
from tests.service.conftest import LAYOUT, start_daemon

FAST = Deadlines(lookup_timeout_s=0.3, load_timeout_s=0.5, save_timeout_s=0.5, breaker_failures=3,
                 breaker_cooldown_s=0.2, save_queue_chunks=2)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("guarded"), host_chunks=32)
    yield d
    d.close()


@pytest.fixture
def guarded(daemon: Daemon) -> Iterator[KVStoreClient]:
    store = KVStoreClient(daemon.url, deadlines=FAST, name="test")
    yield store
    store.close()


def until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def chunks(n: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(LAYOUT.chunk_shape, generator=gen) for _ in range(n)]


def frozen(daemon: Daemon) -> Callable[[], None]:
    assert daemon.proc is not None
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    return lambda: os.kill(daemon.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]


def test_a_frozen_daemon_is_a_miss_then_the_breaker_opens_and_closes(daemon: Daemon, guarded: KVStoreClient,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    keys = guarded.chunk_keys(list(range(3 * LAYOUT.chunk_tokens)))
    assert guarded.put_many(keys, chunks(3, 1)).ok and guarded.lookup_keys(keys) == 3
    thaw = frozen(daemon)
    try:
        with caplog.at_level(logging.WARNING, logger="kvstore.breaker"):
            outs = [torch.zeros(LAYOUT.chunk_shape) for _ in keys]
            late = guarded.get_guarded(keys, outs)
            assert late.value == [False] * 3 and late.pending is None, "the read ended at its deadline: no late read"
            assert guarded.breaker.is_open and "breaker open after a timeout" in caplog.text, "one timeout opens it"
            skipped = guarded.counters["skipped_breaker_open"]
            assert guarded.lookup_keys(keys) == 0 and guarded.counters["skipped_breaker_open"] == skipped + 1
            unsaved = guarded.put_many(keys[:1], chunks(1, 2))
            assert set(unsaved.not_stored) == {keys[0]} and "breaker open" in unsaved.not_stored[keys[0]]
    finally:
        thaw()
    with caplog.at_level(logging.WARNING, logger="kvstore.breaker"):
        until(lambda: guarded.lookup_keys(keys) == 3)
    assert not guarded.breaker.is_open and "breaker closed" in caplog.text
    counters = guarded.counters
    assert counters["load_timeouts"] == 1 and counters["breaker_opened"] == 1


@pytest.mark.parametrize("what", ["lookup", "save"])
def test_the_first_lookup_or_save_timeout_opens_the_breaker(daemon: Daemon, guarded: KVStoreClient, what: str) -> None:
    """Regression (issue 43): three timeouts in a row opened it, two of them 10 s saves while a request waited."""
    keys = guarded.chunk_keys(list(range(200, 200 + LAYOUT.chunk_tokens)))
    thaw = frozen(daemon)
    try:
        if what == "lookup":
            assert guarded.lookup_keys(keys) == 0
        else:
            assert not guarded.put_many(keys, chunks(1, 5)).ok
        assert guarded.breaker.is_open and guarded.counters[f"{what}_timeouts"] == 1
        assert guarded.counters["breaker_opened"] == 1 and guarded.counters["failures"] == 1
    finally:
        thaw()

    def answers() -> bool:
        guarded.lookup_keys(keys)  # the probe once the cool-down ran
        return not guarded.breaker.is_open

    until(answers)


def test_the_save_queue_drops_what_it_cannot_hold_and_counts_it(daemon: Daemon, guarded: KVStoreClient,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    keys = guarded.chunk_keys(list(range(100, 100 + 5 * LAYOUT.chunk_tokens)))
    thaw = frozen(daemon)
    try:
        with caplog.at_level(logging.WARNING, logger="connector.save_queue"):
            queued = guarded.save_async(keys[:2], chunks(2, 3)) + guarded.save_async(keys[2:], chunks(3, 4))
        assert queued == 2 and guarded.counters["dropped_save_chunks"] == 3
        assert caplog.text.count("save queue full") == 1, "logged once per interval, not per chunk"
    finally:
        thaw()
    guarded.wait_saves()
    until(lambda: guarded.lookup_keys(keys[:2]) == 2)  # what was queued is stored once the daemon answers


def test_bad_input_still_raises_through_the_guard(guarded: KVStoreClient) -> None:
    with pytest.raises(BadChunkError):
        guarded.lookup_keys([b"short"])
    assert not guarded.breaker.is_open


def test_deadline_options_are_checked_and_parsed_from_an_engine_map() -> None:
    options = StoreOptions.from_mapping({"url": "http://127.0.0.1:1", "lookup_timeout_s": "0.25",
                                         "save_queue_chunks": "8"})
    assert options.deadlines.lookup_timeout_s == 0.25 and options.deadlines.save_queue_chunks == 8
    with pytest.raises(ConfigError, match="lookup_timeout_s=0.0 must be > 0"):
        Deadlines(lookup_timeout_s=0.0)
    with pytest.raises(ConfigError, match="not a number"):
        Deadlines.from_mapping({"load_timeout_s": "fast"})
    with pytest.raises(ConfigError, match="unknown kvstore option"):
        StoreOptions.from_mapping({"lookup_timeout": 1})
