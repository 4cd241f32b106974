"""With a shared tier (PFS or Redis) a lookup may ask that tier, so the daemon runs it on a thread,
never on the event loop; with only local tiers it is an index read and runs inline.

Regression: service/backend.py decided `lookup_is_memory_only` by checking for PFS tiers only, so
with Redis configured every lookup miss made Redis round trips inline on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from service.app import Runtime
from service.backend import Backend
from service.config import ServiceConfig
from service.tenants import TenantDirectory
from tests.cluster.factories import node_store, prompt

pytestmark = pytest.mark.redis


def _lookup_thread(store: Any) -> threading.Thread:
    """Run one lookup through the daemon's Runtime, as the /v1/lookup route does; the thread it ran on."""
    config = ServiceConfig()
    runtime = Runtime(Backend(store, config), TenantDirectory(config.tenants, store.namespace), io_threads=2)
    ran_on: list[threading.Thread] = []

    def lookup() -> int:
        ran_on.append(threading.current_thread())
        return store.lookup(prompt(2, seed=7))

    async def main() -> None:  # the event loop runs on the main thread
        assert await runtime.run_lookup(lookup) == 0  # a miss: the shared tiers are asked

    asyncio.run(main())
    assert len(ran_on) == 1
    return ran_on[0]


def test_lookup_with_a_redis_tier_runs_off_the_event_loop(tmp_path: Path, redis_url: str) -> None:
    with node_store(tmp_path, "a", redis_url=redis_url) as store:
        assert _lookup_thread(store) is not threading.main_thread()


def test_lookup_with_local_tiers_only_runs_inline(tmp_path: Path) -> None:
    with node_store(tmp_path, "a") as store:
        assert _lookup_thread(store) is threading.main_thread()
