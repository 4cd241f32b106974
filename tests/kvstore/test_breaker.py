"""kvstore/breaker.py: the one breaker, configured per use (threshold, probe, cool-down, timeouts)."""

from __future__ import annotations

import pytest

from kvstore.breaker import Breaker


def test_an_open_breaker_lets_one_probe_through_after_its_cooldown() -> None:
    """The engine side's use: a few failures open it; after the cool-down one probe at a time."""
    now = [0.0]
    breaker = Breaker("unit", failures=2, cooldown_s=5.0, clock=lambda: now[0])
    breaker.record(False, "x")
    assert breaker.allow() and not breaker.is_open
    breaker.record(False, "x")
    assert breaker.is_open and not breaker.allow() and breaker.times_opened == 1
    now[0] = 5.0
    assert breaker.allow() and not breaker.allow(), "one probe at a time"
    breaker.record(False, "probe failed")
    assert not breaker.allow(), "a failed probe starts another cool-down"
    now[0] = 10.0
    assert breaker.allow()
    breaker.record(True)
    assert not breaker.is_open and breaker.allow()


def test_without_a_probe_every_call_tries_again_after_the_cooldown() -> None:
    """The Redis tier's use: the first failure opens it; after `retry_after_s` every call goes through."""
    now = [0.0]
    breaker = Breaker("redis", failures=1, cooldown_s=1.0, probe=False, clock=lambda: now[0])
    breaker.record(False, "connection refused")
    assert not breaker.allow() and breaker.last_failure == "connection refused"
    now[0] = 1.0
    assert breaker.allow() and breaker.allow(), "no single probe: everyone tries"
    breaker.record(False, "refused again")
    assert not breaker.allow() and breaker.times_opened == 1, "still the same outage"
    now[0] = 2.0
    breaker.record(True)
    assert not breaker.is_open


@pytest.mark.parametrize("opens_on_timeout", [True, False])
def test_a_timeout_opens_it_at_once_unless_told_otherwise(opens_on_timeout: bool) -> None:
    breaker = Breaker("t", failures=3, cooldown_s=1.0, opens_on_timeout=opens_on_timeout, clock=lambda: 0.0)
    breaker.record(False, "late", timed_out=True)
    assert breaker.is_open is opens_on_timeout


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="failures"):
        Breaker("bad", failures=0, cooldown_s=1.0)
