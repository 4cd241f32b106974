"""The client's retry budget (connector/retry_budget.py): a dropped connection is retried once while
the budget lasts; a 503, a 429, a timeout and bad input are never retried."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from connector.client_segment import DescriptorSocketBusy
from connector.daemon_http import RemoteError
from connector.lean_http import DaemonUnreachable
from connector.retry_budget import RetryBudget, is_retryable
from kvstore.errors import LayoutMismatchError, TierFullError, TierIOError


def _failing(exc: Exception, times: int) -> tuple[Callable[[], str], list[int]]:
    calls = [0]

    def fn() -> str:
        calls[0] += 1
        if calls[0] <= times:
            raise exc
        return "ok"

    return fn, calls


def _timed_out() -> DaemonUnreachable:
    try:
        raise DaemonUnreachable("kvstore daemon: timed out") from TimeoutError("timed out")
    except DaemonUnreachable as exc:
        return exc


@pytest.mark.parametrize(("exc", "retried"), [
    (DaemonUnreachable("dropped the connection"), True), (ConnectionResetError(), True),
    (DescriptorSocketBusy("closed unanswered"), True), (TierIOError("503"), False), (TierFullError("429"), False),
    (RemoteError(403, "no"), False), (LayoutMismatchError("bad"), False), (TimeoutError(), False)])
def test_only_a_dropped_connection_is_retried(exc: Exception, retried: bool) -> None:
    assert is_retryable(exc) is retried
    fn, calls = _failing(exc, 1)
    budget = RetryBudget(sleep=lambda s: None)
    if retried:
        assert budget.call(fn) == "ok" and calls[0] == 2
    else:
        with pytest.raises(type(exc)):
            budget.call(fn)
        assert calls[0] == 1


def test_a_timeout_behind_a_transport_error_is_not_retried() -> None:
    assert not is_retryable(_timed_out())


def test_the_budget_runs_out_and_refills_with_calls() -> None:
    budget = RetryBudget(ratio=0.25, max_tokens=2.0, sleep=lambda s: None)
    for _ in range(2):  # the two saved-up retries (tokens 2 -> 1 -> 0.25)
        fn, _ = _failing(ConnectionResetError(), 1)
        assert budget.call(fn) == "ok"
    fn, calls = _failing(ConnectionResetError(), 1)
    with pytest.raises(ConnectionResetError):  # 0.5 tokens: no retry
        budget.call(fn)
    assert budget.num_retries == 2 and calls[0] == 1
    assert budget.call(lambda: "ok") == "ok"  # 0.75; the next call brings a whole retry again
    fn, calls = _failing(ConnectionResetError(), 1)
    assert budget.call(fn) == "ok" and calls[0] == 2
