"""Tiny factories shared by the test suite: small layouts, store configs on tmp_path, chunks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.types import TierKind
from service.process import CLI, ChildProcess, use_launcher
from tests.helpers.forkserver import ForkServer

# The files that take longest (pytest --durations, summed per file), run first: scripts/test.sh hands whole files to
# pytest-xdist workers in collection order (--dist loadfile --no-loadscope-reorder), so that none of these is
# left running alone at the end while the other workers wait. Order only: a file not listed runs as collected.
LONG_FILES = ("tests/test_readme.py", "tests/kvstore/test_streamed_reads.py", "tests/cli/test_suite_fresh_clone.py",
              "tests/service/test_pd_proxy.py", "tests/policies/test_adaptive.py", "tests/cluster/test_pd_proxy_route.py",
              "tests/service/test_startup_output.py", "tests/service/test_bad_input.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The LONG_FILES' tests first, each file's tests in their own order (a stable sort)."""
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session", autouse=True)
def fork_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    """Daemons and child programs forked from a process that imported torch once (tests/helpers/forkserver.py),
    started with the session; KVSTORE_TEST_COLD_STARTS=1 starts each daemon in a fresh interpreter instead."""
    cold = os.environ.get("KVSTORE_TEST_COLD_STARTS", "") not in ("", "0")
    server = ForkServer(tmp_path_factory.mktemp("forkserver") / "forkserver.log", enabled=not cold)

    def launch(args: list[str], env: dict[str, str], log: Path) -> ChildProcess:
        return server.spawn([*CLI, *args], env=env, stdout=log)

    server.start()
    previous = use_launcher(launch)
    yield server
    use_launcher(previous)
    server.close()


@pytest.fixture
def small_layout() -> KVLayout:
    # 2 layers x 2 planes x 16 tokens x 2 heads x 32 dims x 2 bytes = 8 KiB per chunk
    return KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, dtype="float16", chunk_tokens=16)


def make_chunk(layout: KVLayout, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(layout.chunk_shape, generator=generator).to(layout.torch_dtype)


def store_config(layout: KVLayout, tmp_path: Path, *, host_chunks: int = 8, nvme_chunks: int = 64,
                 pfs_chunks: int | None = None, **overrides: Any) -> StoreConfig:
    tiers = [TierConfig(kind=TierKind.HOST, capacity_bytes=host_chunks * layout.chunk_bytes)]
    if nvme_chunks:
        tiers.append(TierConfig(kind=TierKind.NVME, capacity_bytes=nvme_chunks * (layout.chunk_bytes + 8192),
                                path=str(tmp_path / "nvme")))
    if pfs_chunks:
        tiers.append(TierConfig(kind=TierKind.PFS, capacity_bytes=pfs_chunks * (layout.chunk_bytes + 8192),
                                path=str(tmp_path / "pfs")))
    overrides.setdefault("put_timeout_s", 2.0)
    return StoreConfig(layout=layout, tiers=tuple(tiers), model_id="test-model", **overrides)
