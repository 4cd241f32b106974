"""The NVMe tier's directory lock: a second owner of one directory is refused naming the holder's
PID, in this process or another; closing (or the holder's death) frees it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from kvstore.errors import ConfigError
from tests.helpers.forkserver import ForkServer
from tests.helpers.waits import follow
from tests.tiers.conftest import REPO_ROOT
from tiers.dir_lock import LOCK_NAME, holder_pid
from tiers.nvme import NVMeTier


def test_second_tier_on_one_directory_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    first = NVMeTier(path=tmp_path, capacity_bytes=1 << 20)
    assert holder_pid(tmp_path) == os.getpid()
    with pytest.raises(ConfigError, match=f"PID {os.getpid()}.*{LOCK_NAME}"):
        NVMeTier(path=tmp_path, capacity_bytes=1 << 20)
    first.close()
    assert holder_pid(tmp_path) is None
    NVMeTier(path=tmp_path, capacity_bytes=1 << 20).close()


def test_lock_held_by_another_process_names_it_and_dies_with_it(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                                fork_server: ForkServer) -> None:
    said = tmp_path_factory.mktemp("holder") / "stdout"
    holder = fork_server.spawn(["-m", "tests.programs.dir_lock_holder", str(tmp_path)], stdout=said, cwd=REPO_ROOT)
    try:
        assert next(follow(said, holder), "").strip() == "locked", said.read_text()
        assert holder_pid(tmp_path) == holder.pid
        with pytest.raises(ConfigError, match=f"PID {holder.pid}"):
            NVMeTier(path=tmp_path, capacity_bytes=1 << 20)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert holder_pid(tmp_path) is None  # the kernel dropped the flock with the process: no stale lock
    NVMeTier(path=tmp_path, capacity_bytes=1 << 20).close()
