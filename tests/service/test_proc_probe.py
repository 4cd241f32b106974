"""Issue 27, item 1: a process of the daemon's uid without capabilities (any shared-memory client:
the descriptor socket is 0600, so they share the daemon's uid) reads nothing of the daemon through
/proc: not its memfd segments through /proc/<pid>/fd, not the admin token through
/proc/<pid>/environ. The same probe reads both from a dumpable control process, so it can fail."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from connector.client import KVStoreClient
from service.process import Daemon, write_config
from tests.service.conftest import LAYOUT, TOKENS

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "probe-admin-token-0123456789"
MARKER = "kvstore-probe-marker-5f1e2d"
SETPRIV = shutil.which("setpriv")
NO_CAPS = (SETPRIV or "setpriv", "--inh-caps=-all", "--bounding-set=-all")  # the same uid, no capability
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or SETPRIV is None,
                                reason="needs Linux /proc and setpriv (util-linux) to drop capabilities")


def _probe(pid: int, marker: str) -> dict[str, Any]:
    """tests/service/proc_probe.py against `pid`, run with every capability dropped (same uid)."""
    done = subprocess.run([*NO_CAPS, sys.executable, "-m", "tests.service.proc_probe", str(pid), marker],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@pytest.fixture(scope="module")
def hardened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon without capabilities (as any unprivileged user runs it) whose admin token comes from
    the environment, so it is in its exec-time environ."""
    mp = pytest.MonkeyPatch()
    mp.setenv("KVSTORE_ADMIN_TOKEN", ADMIN + MARKER)
    root = tmp_path_factory.mktemp("probe")
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True}]
    try:
        config = write_config(root, layout=LAYOUT, host_chunks=16, tenants=tenants)
        d = Daemon(config, root / "daemon.log", prefix=NO_CAPS).start()
    finally:
        mp.undo()
    yield d
    d.close()


def _chunk_with_marker() -> torch.Tensor:
    chunk = torch.zeros(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
    raw = chunk.view(-1).view(torch.uint8)
    raw[:len(MARKER)] = torch.tensor(list(MARKER.encode()), dtype=torch.uint8)
    return chunk


def test_a_same_uid_process_reads_no_memfd_and_no_environ_of_the_daemon(hardened: Daemon) -> None:
    assert hardened.proc is not None
    with KVStoreClient(hardened.url, token=TOKENS["a"], use_shm=True) as a:
        keys = a.chunk_keys(list(range(LAYOUT.chunk_tokens)))
        assert a.put_many(keys, [_chunk_with_marker()]).ok  # the marker now sits in a segment of the daemon
        out = torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
        assert a.get_many(keys, [out]) == [True]
        seen = _probe(hardened.proc.pid, MARKER)
    assert seen["uid"] == os.getuid()  # the daemon's uid too: it is this test's child
    assert int(seen["cap_eff"], 16) == 0, seen
    assert str(seen["fds"]).startswith("error"), seen
    assert str(seen["environ"]).startswith("error"), seen
    assert not seen["memfd_marker"] and not seen["environ_marker"]


def test_the_same_probe_reads_a_dumpable_process(tmp_path: Path) -> None:
    """The control: a plain process of the same uid and capabilities (none), holding a memfd and a secret
    in its environment, is read in full."""
    holder = subprocess.Popen([*NO_CAPS, sys.executable, "-m", "tests.service.memfd_holder", MARKER], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin", "SECRET": MARKER})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        seen = _probe(holder.pid, MARKER)
    finally:
        holder.kill()
        holder.wait()
    assert int(seen["cap_eff"], 16) == 0, seen
    assert seen["fds"] and not str(seen["fds"]).startswith("error"), seen
    assert seen["memfd_marker"] and seen["environ_marker"], seen
