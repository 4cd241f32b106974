"""connector.vllm.finish_wait: how long a step's end waits for the background loads it started."""

from __future__ import annotations

import pytest

from connector.vllm.finish_wait import MAX_WAIT_S, SHARE, FinishWait


class Clock:
    """A clock the test moves by hand (the step times are the test's own figures)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stepped(step_s: float, steps: int = 1) -> tuple[FinishWait, Clock]:
    clock = Clock()
    wait = FinishWait(clock=clock)
    wait.step_ended()
    for _ in range(steps):
        clock.now += step_s
        wait.step_ended()
    return wait, clock


def test_no_wait_before_a_step_is_measured() -> None:
    wait = FinishWait(clock=Clock())
    assert wait.budget_s() == 0.0
    wait.step_ended()  # one end: no step length yet
    assert wait.budget_s() == 0.0


def test_the_budget_is_a_share_of_the_step_capped() -> None:
    short, _ = stepped(0.1)
    assert short.budget_s() == pytest.approx(SHARE * 0.1)
    long, _ = stepped(10.0)
    assert long.budget_s() == MAX_WAIT_S, "a step of seconds still waits at most MAX_WAIT_S"


def test_the_step_estimate_follows_shorter_steps() -> None:
    wait, clock = stepped(1.0)
    assert wait.budget_s() == MAX_WAIT_S
    for _ in range(40):
        clock.now += 0.01
        wait.step_ended()
    assert wait.budget_s() == pytest.approx(SHARE * 0.01, rel=0.05), "10 ms steps: wait at most 2 ms"
