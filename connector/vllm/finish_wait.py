"""A short wait at the end of a step for the background loads it started (worker side, pure Python, no vllm import).

vLLM 0.32 starts a step's background loads after its forward pass and asks `get_finished` right after. A load
from the host tier takes milliseconds; if it is not yet done when asked, vLLM hears of it only at the end of the
next step, and the request runs one step later than it could: on a CPU a step that prefills other prompts takes
seconds. So the worker waits for the loads this step started, at most

    min(MAX_WAIT_S, SHARE x step time)

(the budget caps what a slow load costs every running request). Step time is the time between two
`get_finished` calls, exponentially weighted as load_pacing weighs its figures. The loads' rate measured while
they run beside the forward pass is no guide here: at the step's end the forward pass is over and the loader
threads have the cores (in the first serving run with such a gate, loads measured at ~40 ms a chunk beside
the forward pass kept it shut but for 5 steps in 357 loads). A load that may wait for chunks a prefill instance
announced is never waited for here. `"load_finish_wait": false` in the connector's extra config turns the
wait off.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from connector.vllm.load_pacing import ewma

SHARE = 0.2  # of a step: the most a step's end waits for its loads
MAX_WAIT_S = 0.05


class FinishWait:
    """How long a step's end waits for the loads it started."""

    def __init__(self, *, share: float = SHARE, max_wait_s: float = MAX_WAIT_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.share, self.max_wait_s, self._clock = share, max_wait_s, clock
        self.step_s: float | None = None  # EWMA of the time between two step ends
        self._last_end: float | None = None

    def step_ended(self) -> None:
        """A step ended (vLLM asked `get_finished`)."""
        now = self._clock()
        if self._last_end is not None:
            self.step_s = ewma(self.step_s, now - self._last_end)
        self._last_end = now

    def budget_s(self) -> float:
        """How long a step's end may wait for the loads it started: 0 before a step has been measured."""
        if self.step_s is None:
            return 0.0
        return min(self.max_wait_s, self.share * self.step_s)

