"""service/malloc_tuning: on glibc the arena limit and heap trims take effect; the trimmer thread stops."""

from __future__ import annotations

import platform

import pytest

from service.malloc_tuning import HeapTrimmer, limit_arenas, trim
from tests.helpers.waits import wait_until

GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt / malloc_trim")
def test_arena_limit_and_trim_are_accepted_by_glibc() -> None:
    assert limit_arenas(2) is True
    blocks = [bytearray(64 << 10) for _ in range(2048)]  # 128 MiB of chunk-sized blocks
    del blocks[::2]
    blocks.clear()
    assert trim() is True  # the freed middles of the heap go back to the kernel


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc_trim")
def test_the_trimmer_trims_until_closed() -> None:
    trimmer = HeapTrimmer(interval_s=0.01).start()
    assert wait_until(lambda: trimmer.trims >= 3, timeout_s=10.0)
    trimmer.close()
    done = trimmer.trims
    assert not trimmer.is_running and trimmer.trims == done
