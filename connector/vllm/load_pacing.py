"""Which loads the step does itself and which run in the background (scheduler side, pure Python, no vllm import).

vLLM offers a connector two ways to load a request's prefix:

    in the step       the worker loads before the forward pass and the request computes its remaining
                      tokens in that same step; every running request waits for the load
    in the background the request waits in WAITING_FOR_REMOTE_KVS while a loader thread fills its blocks;
                      nobody waits for the load, but the loading request pays about BACKGROUND_STEPS whole
                      steps: vLLM 0.32 starts a step's background loads after its forward pass (when the
                      step has no in-step load), hears them finished at the end of a step and schedules the
                      request in the step after. A step that runs other prompts' prefill takes seconds on a
                      CPU.

`async_load = "auto"` (opt-in; the default is true, every load in the background) weighs the two: the
running requests would each wait the load's expected time; the loading request would wait about
BACKGROUND_STEPS steps. The load runs in the step when

    expected load time x running requests <= BACKGROUND_STEPS x step time

so the requests' summed wait is the smaller. Expected load time is the load's bytes over the worker's own
measured load rate (its `loaded_bytes` and `load_seconds`, which reach the scheduler half with every step's
output); step time is the scheduler half's measure from building a step's plan to hearing its output. Both
are exponentially weighted (EWMA_WEIGHT per observation). Until the worker has measured a load, every load
runs in the background (the behaviour of `async_load = true`), so a store of unknown speed never stalls the
engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kvstore.errors import ConfigError
from kvstore.flags import parse_bool_or_auto

EWMA_WEIGHT = 0.2  # weight of the newest observation
BACKGROUND_STEPS = 2  # whole steps a background load's request waits more than an in-step load's


class LoadPacing:
    """The scheduler half's running estimate of load speed and step time, and the decision per load."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.load_bytes_per_s: float | None = None  # None: no load measured yet
        self.step_s: float | None = None
        self.running = 0  # requests the last planned step ran
        self._step_started: float | None = None

    def step_planned(self, num_running: int) -> None:
        """A step's plan was built for `num_running` requests; its output comes back in `step_done`."""
        self.running = num_running
        self._step_started = self._clock()

    def step_done(self, loaded_bytes: float, load_seconds: float) -> None:
        """A step's output arrived, with what the workers loaded in it and how long the loads took."""
        if self._step_started is not None:
            self.step_s = ewma(self.step_s, self._clock() - self._step_started)
            self._step_started = None
        if loaded_bytes > 0 and load_seconds > 0:
            self.load_bytes_per_s = ewma(self.load_bytes_per_s, loaded_bytes / load_seconds)

    def expected_load_s(self, num_bytes: float) -> float | None:
        """Seconds a load of `num_bytes` is expected to take (None: no load measured yet)."""
        if self.load_bytes_per_s is None:
            return None
        return num_bytes / self.load_bytes_per_s

    def in_step(self, num_bytes: float) -> bool:
        """True when loading `num_bytes` in the step costs the running requests less than the step the
        loading request would otherwise wait."""
        expected = self.expected_load_s(num_bytes)
        if expected is None or self.step_s is None:
            return False
        return expected * max(1, self.running) <= BACKGROUND_STEPS * self.step_s


def ewma(old: float | None, new: float) -> float:
    """`new` weighted EWMA_WEIGHT against the running average `old` (None: nothing seen yet)."""
    return new if old is None else (1 - EWMA_WEIGHT) * old + EWMA_WEIGHT * new


def in_background(mode: str, pacing: LoadPacing, num_bytes: float, wait_s: float) -> bool:
    """Whether a load of `num_bytes` runs on a loader thread under `mode` ("auto", "background", "step"). A load
    that may wait `wait_s` > 0 for chunks a prefill instance announced never runs in an "auto" step: the whole
    engine would wait with it."""
    if mode != "auto":
        return mode == "background"
    return wait_s > 0 or not pacing.in_step(num_bytes)


def load_mode(value: object) -> str:
    """kv_connector_extra_config's async_load as "background" (true, the default), "step" (false) or "auto".

    Raises:
        ConfigError: any other value.
    """
    try:
        mode = parse_bool_or_auto(value, field="kv_connector_extra_config async_load")
    except ConfigError:
        raise ConfigError(f"kv_connector_extra_config async_load={value!r}: use \"auto\" (in the step when cheaper, "
                          f"else in the background), true (always in the background, the default) or false") from None
    return "auto" if mode == "auto" else "background" if mode else "step"
