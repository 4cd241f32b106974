"""SGLang 0.5.23's HiCache storage layer (its own host pool and backend factory) with the kvstore backend.

A full SGLang server needs CUDA kernels; its storage layer runs on CPU and is what is proven here:
pages set from the host pool (queued: SGLang's backup thread never waits for the daemon), the pool
cleared, and batch_exists/batch_get_v1 restoring them byte-identical, in this process and in a second
process with its own host pool.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang.srt.mem_cache.hicache_storage", reason="SGLang is not installed: use scripts/integration_env.sh's env")

import torch

from service.process import Daemon
from tests.integration.conftest import ROOT, llama_layout, start_daemon
from tests.integration.sglang_pool import DIM, HEADS, LAYERS, PAGE, make_backend, make_host_pool, page_keys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
NUM_PAGES = 5


LAYOUT = llama_layout(PAGE, num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM)


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the round trips; each layout writes its own pages (keys salted by the layout's name)."""
    daemon = start_daemon(tmp_path_factory.mktemp("sglang"), LAYOUT)
    yield daemon
    daemon.close()


@pytest.fixture
def daemon(daemon_factory: Any) -> Daemon:
    """A daemon of its own, for a test that kills it."""
    return daemon_factory(LAYOUT)


def pages_of(pool: Any, indices: torch.Tensor) -> list[torch.Tensor]:
    return [pool.get_data_page(int(i), flat=False).clone() for i in indices[::PAGE]]


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_pages_set_cleared_and_restored_byte_identical(shared_daemon: Daemon, layout: str, tmp_path: Path) -> None:
    daemon = shared_daemon
    pool = make_host_pool(layout)
    backend = make_backend(daemon.url, pool)
    keys, indices = page_keys(NUM_PAGES, salt=layout), torch.arange(NUM_PAGES * PAGE)
    pool.kv_buffer.normal_(generator=torch.Generator().manual_seed(5))
    expected = pages_of(pool, indices)
    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, indices) == [True] * NUM_PAGES
    pool.kv_buffer.zero_()  # the queued saves hold copies of their own
    backend.store.wait_saves()
    assert backend.batch_exists(keys) == NUM_PAGES
    assert backend.batch_exists([*keys[:2], "never-stored", *keys[3:]]) == 2, "leading pages only"
    assert backend.batch_get_v1(keys, indices) == [True] * NUM_PAGES
    for got, want in zip(pages_of(pool, indices), expected, strict=True):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))

    out = tmp_path / "second.pt"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run([sys.executable, "-m", "tests.integration.sglang_pool", daemon.url, layout, str(NUM_PAGES), str(out),
                    layout], cwd=ROOT, env=env, check=True, timeout=300)
    second = torch.load(out)
    assert second["exists"] == NUM_PAGES and second["got"] == [True] * NUM_PAGES
    for got, want in zip(second["pages"], expected, strict=True):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    backend.close()


def test_a_missing_page_is_a_miss_and_leaves_the_pool_alone(daemon: Daemon) -> None:
    pool = make_host_pool("layer_first")
    backend = make_backend(daemon.url, pool)
    pool.kv_buffer.fill_(7.0)
    assert backend.batch_get_v1(["absent-0", "absent-1"], torch.arange(2 * PAGE)) == [False, False]
    assert bool((pool.kv_buffer == 7.0).all())
    daemon.kill()
    assert backend.batch_exists(page_keys(2)) == 0, "daemon down: a miss, not an exception"
    assert backend.batch_set_v1(page_keys(1), torch.arange(PAGE)) == [True], "queued: the caller never waits"
    backend.store.wait_saves()
    assert backend.store.counters["unsaved_chunks"] == 1, "and counted as not stored, not raised"
    backend.close()
