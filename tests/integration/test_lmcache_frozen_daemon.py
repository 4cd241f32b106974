"""LMCache with the kvstore plugin and a daemon frozen by SIGSTOP: a lookup is never behind a put.

LMCache runs the plugin's store calls on one I/O thread, in order. A put that waited for the daemon there
(up to its save budget) held every lookup after it, and LMCache's lookup is on the request's path. Puts now
copy LMCache's buffers and go to the bounded save queue; what was queued is stored once the daemon answers.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

pytest.importorskip("lmcache.v1.cache_engine", reason="LMCache is not installed: use scripts/integration_env.sh's env")

import torch

from connector.lmcache.plugin import live_connectors, require_remote
from tests.helpers.waits import wait_until
from tests.integration.test_lmcache import CHUNK, NUM_CHUNKS, daemon, kv, make_engine, tokens, wait_stored

__all__ = ["daemon"]  # the fixture
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
SAVE_TIMEOUT_S = 60.0  # a put that waited would hold the lookup behind it this long


def test_a_lookup_is_never_behind_a_put_to_a_frozen_daemon(daemon: Any) -> None:
    before = set(live_connectors())
    engine = make_engine(daemon.url, save_timeout_s=SAVE_TIMEOUT_S)
    require_remote(engine)
    (plugin,) = set(live_connectors()) - before
    put, reached = plugin._put, threading.Event()

    def observed_put(*args: Any) -> None:  # observed, not changed: says when the plugin's I/O thread has the put
        reached.set()
        put(*args)

    plugin._put = observed_put  # type: ignore[method-assign,assignment]
    prompt, other = tokens(31), tokens(32)
    looked_up: list[int] = []
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        engine.store(prompt, kv=kv(31))
        assert reached.wait(30.0), "LMCache handed the put to the plugin's I/O thread"
        lookup = threading.Thread(target=lambda: looked_up.append(engine.lookup(other)), daemon=True)
        lookup.start()
        lookup.join(SAVE_TIMEOUT_S / 2)
        assert looked_up == [0], "the lookup waited behind the put to the frozen daemon"
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    wait_stored(daemon.url, NUM_CHUNKS)  # the queued put, once the daemon answers
    reader = make_engine(daemon.url)
    assert wait_until(lambda: reader.lookup(prompt) == NUM_CHUNKS * CHUNK, 30.0), "hits once the daemon answers"
    target = torch.zeros(2, *kv(31).shape[1:])
    assert int(reader.retrieve(prompt, kv=target).sum()) == NUM_CHUNKS * CHUNK
    assert torch.equal(target.view(torch.int32), kv(31).view(torch.int32))
    for e in (engine, reader):
        e.close()
