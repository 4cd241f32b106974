"""connector.vllm.load_pacing: when a load runs in the step and when in the background."""

from __future__ import annotations

import pytest

from connector.vllm.load_pacing import BACKGROUND_STEPS, LoadPacing, in_background, load_mode
from kvstore.errors import ConfigError

MIB = 1 << 20


class Clock:
    """A clock the test moves by hand (the step times are the test's own figures)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def paced(step_s: float, load_bytes_per_s: float, running: int) -> tuple[LoadPacing, Clock]:
    """A pacing that has seen one step of `step_s` with a load at `load_bytes_per_s`, then plans `running`."""
    clock = Clock()
    pacing = LoadPacing(clock)
    pacing.step_planned(3)
    clock.now += step_s
    pacing.step_done(loaded_bytes=load_bytes_per_s * 0.01, load_seconds=0.01)
    pacing.step_planned(running)
    return pacing, clock


def test_no_measured_load_means_every_load_runs_in_the_background() -> None:
    pacing = LoadPacing(Clock())
    assert not pacing.in_step(1)
    pacing.step_planned(1)
    pacing.step_done(loaded_bytes=0, load_seconds=0)  # a step without a load: no rate yet
    assert pacing.expected_load_s(MIB) is None and not pacing.in_step(1)


def test_a_load_shorter_than_the_step_it_would_cost_runs_in_the_step() -> None:
    pacing, _ = paced(step_s=1.0, load_bytes_per_s=100 * MIB, running=4)
    assert pacing.expected_load_s(10 * MIB) == pytest.approx(0.1)
    budget_mib = 100 * BACKGROUND_STEPS * 1.0 / 4  # the load 4 running requests may wait: the steps it would cost
    assert pacing.in_step(0.9 * budget_mib * MIB)
    assert not pacing.in_step(1.1 * budget_mib * MIB)


def test_more_running_requests_send_the_same_load_to_the_background() -> None:
    few, _ = paced(step_s=0.5, load_bytes_per_s=100 * MIB, running=1)
    many, _ = paced(step_s=0.5, load_bytes_per_s=100 * MIB, running=16)
    assert few.in_step(20 * MIB) and not many.in_step(20 * MIB)


def test_short_steps_send_loads_to_the_background() -> None:
    slow_steps, _ = paced(step_s=2.0, load_bytes_per_s=100 * MIB, running=2)
    fast_steps, _ = paced(step_s=0.02, load_bytes_per_s=100 * MIB, running=2)
    assert slow_steps.in_step(8 * MIB)
    assert not fast_steps.in_step(8 * MIB), "2 x 80 ms of stall against a 20 ms step"


def test_estimates_follow_a_slower_store() -> None:
    pacing, clock = paced(step_s=1.0, load_bytes_per_s=100 * MIB, running=2)
    before = pacing.expected_load_s(MIB)
    for _ in range(20):  # the store slows to a tenth
        pacing.step_planned(2)
        clock.now += 1.0
        pacing.step_done(loaded_bytes=10 * MIB * 0.01, load_seconds=0.01)
    after = pacing.expected_load_s(MIB)
    assert before is not None and after is not None and after > 8 * before
    assert not pacing.in_step(40 * MIB)


@pytest.mark.parametrize(("value", "mode"), [("auto", "auto"), (" Auto ", "auto"), (True, "background"),
                                             ("true", "background"), (False, "step"), ("off", "step")])
def test_async_load_values(value: object, mode: str) -> None:
    assert load_mode(value) == mode


def test_an_unknown_async_load_value_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match="auto.*true.*false"):
        load_mode("sometimes")


def test_the_mode_decides_and_auto_never_holds_the_step_for_a_handoff_wait() -> None:
    pacing, _ = paced(step_s=1.0, load_bytes_per_s=100 * MIB, running=1)
    assert not in_background("auto", pacing, MIB, wait_s=0.0), "cheap: in the step"
    assert in_background("auto", pacing, MIB, wait_s=5.0), "may wait for announced chunks: in the background"
    assert in_background("auto", pacing, 500 * MIB, wait_s=0.0), "dear: in the background"
    assert in_background("background", pacing, MIB, wait_s=0.0)
    assert not in_background("step", pacing, 500 * MIB, wait_s=5.0), "async_load false: always in the step"
