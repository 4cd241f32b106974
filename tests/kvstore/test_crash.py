"""A store process killed with SIGKILL in the middle of writes: after restart every acknowledged
chunk reads back byte-identical and no torn chunk is visible."""

import signal
from pathlib import Path

import pytest
import torch

from kvstore.store import TieredStore
from tests.conftest import make_chunk, store_config
from tests.helpers.forkserver import ForkServer
from tests.helpers.waits import follow
from tests.programs.crash_writer import LAYOUT
from tiers.dir_lock import LOCK_NAME


def test_sigkill_mid_write_loses_no_acknowledged_chunk(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                       fork_server: ForkServer) -> None:
    out = tmp_path_factory.mktemp("crash-writer") / "stdout"  # outside tmp_path: only the store's files are there
    child = fork_server.spawn(["-m", "tests.programs.crash_writer", str(tmp_path)], stdout=out,
                              stderr=out.with_name("stderr"))
    acked: dict[bytes, int] = {}
    for line in follow(out, child):
        _, key_hex, seed = line.split()
        acked[bytes.fromhex(key_hex)] = int(seed)
        if len(acked) >= 40:
            break
    child.send_signal(signal.SIGKILL)  # the child is in the middle of the next batch's writes
    child.wait()
    assert child.returncode == -signal.SIGKILL

    with TieredStore(store_config(LAYOUT, tmp_path, host_chunks=4, nvme_chunks=400)) as store:
        recovered = [key for key, _ in store.levels[1].tier.keys()]
        assert set(acked) <= set(recovered)
        chunk = torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
        for key in recovered:  # every visible chunk is whole (checksums pass)
            assert store.get(key, chunk), f"torn or corrupt chunk {key.hex()} is visible"
            if key in acked:
                assert torch.equal(chunk, make_chunk(LAYOUT, acked[key]))
        assert store.stats()["tiers"]["nvme"]["corrupt"] == 0
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".kvc") and p.name != LOCK_NAME]
    assert leftovers == [], "temp files of the killed writes were not cleaned at recovery"
