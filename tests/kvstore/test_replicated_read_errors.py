"""ReplicatedRead turns only the errors that mean a miss into a miss, and logs them; anything else
(a programming error, KeyboardInterrupt, SystemExit) reaches the caller of `results()`.

Regression: a reader caught `BaseException` and reported a silent miss, so a bug in the read path
(or a Ctrl-C landing in a reader thread) looked like a cold cache.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from kvstore.errors import TierIOError
from kvstore.store.replicated_read import ReadJob, ReplicatedRead


def _run(read_fn: Any, levels_per_job: Any, readers_per_level: Any=2) -> Any:
    jobs = [ReadJob(key=bytes([i]) * 16, levels=set(levels)) for i, levels in enumerate(levels_per_job)]
    with ThreadPoolExecutor(8) as pool:
        return list(ReplicatedRead(jobs, read_fn, pool, readers_per_level).start().results())


def test_an_io_error_is_a_logged_miss_and_another_level_serves_the_chunk(caplog: pytest.LogCaptureFixture) -> None:
    def read(level: Any, job: Any) -> Any:
        if level == 0:
            raise TierIOError("disk 0 failed; treat as a miss")
        return True

    with caplog.at_level(logging.WARNING, logger="kvstore.store.replicated_read"):
        assert _run(read, [{0, 1}, {0, 1}, {0}]) == [(0, True), (1, True), (2, False)]
    assert any("disk 0 failed" in record.getMessage() for record in caplog.records)


def test_an_os_error_is_a_miss(caplog: pytest.LogCaptureFixture) -> None:
    def read(level: Any, job: Any) -> None:
        raise OSError(5, "Input/output error")

    with caplog.at_level(logging.WARNING, logger="kvstore.store.replicated_read"):
        assert _run(read, [{0}, {0}]) == [(0, False), (1, False)]
    assert caplog.records


@pytest.mark.parametrize("error", [TypeError("bug in the read path"), KeyboardInterrupt(), SystemExit(3)])
def test_other_errors_reach_the_caller(error: Any) -> None:
    def read(level: Any, job: Any) -> Any:
        if job == 1:
            raise error
        return True

    with pytest.raises(type(error)):
        _run(read, [{0, 1}, {0, 1}, {0, 1}, {1}])
