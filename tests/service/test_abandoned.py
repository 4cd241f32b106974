"""`AbandonedCalls` with real threads: a call counts while it runs past its deadline, also when its
worker picks it up only after the deadline; a finished or failed call never counts; at the cap new
calls are refused, except those that cannot wait on a backend."""

from __future__ import annotations

import threading

import pytest

from service.abandoned import AbandonedCalls
from service.errors import TooManyAbandonedError


def _blocked(calls: AbandonedCalls, gate: threading.Event) -> threading.Thread:
    started = threading.Event()

    def work() -> str:
        started.set()
        gate.wait(30)
        return "done"

    call = calls.track(work, ())
    thread = threading.Thread(target=call)
    thread.start()
    assert started.wait(30)
    call.abandon()
    return thread


def test_counted_while_running_past_the_deadline_and_capped() -> None:
    calls, gate = AbandonedCalls(limit=2), threading.Event()
    threads = [_blocked(calls, gate) for _ in range(2)]
    assert calls.snapshot()["abandoned_calls"] == 2
    with pytest.raises(TooManyAbandonedError, match="max_abandoned_calls"):
        calls.track(print, ())
    assert calls.snapshot()["refused_abandoned"] == 1
    calls.track(print, (), refuse=False)()  # e.g. a lookup of the local index only
    gate.set()
    for thread in threads:
        thread.join(30)
    assert calls.snapshot() == {"abandoned_calls": 0, "abandoned_bytes": 0, "abandoned_limit": 2,
                                "abandoned_total": 2, "refused_abandoned": 1}
    calls.track(print, ())  # open again


def test_a_call_picked_up_after_its_deadline_counts_while_it_runs() -> None:
    calls, gate, seen = AbandonedCalls(limit=4), threading.Event(), []
    call = calls.track(lambda body: seen.append(calls.snapshot()) or gate.wait(30), (b"x" * 100,))  # type: ignore[func-returns-value]
    call.abandon()  # the deadline passed before any worker started it
    assert calls.snapshot()["abandoned_calls"] == 0
    thread = threading.Thread(target=call)
    thread.start()
    gate.set()
    thread.join(30)
    assert seen[0]["abandoned_calls"] == 1 and seen[0]["abandoned_bytes"] == 100
    assert calls.snapshot()["abandoned_calls"] == 0 == calls.snapshot()["abandoned_bytes"]


def test_finished_or_failed_calls_are_never_abandoned() -> None:
    calls = AbandonedCalls(limit=1)

    def fail() -> None:
        raise OSError("disk")

    done, failed = calls.track(lambda: 1, ()), calls.track(fail, ())
    assert done() == 1
    with pytest.raises(OSError):
        failed()
    done.abandon()
    failed.abandon()
    assert calls.snapshot()["abandoned_total"] == 0 and calls.snapshot()["abandoned_calls"] == 0
