"""PFSTier: a directory shared by processes. Another process's chunk is a hit; racing writers leave one whole chunk."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from kvstore.types import TierKind
from tests.helpers.forkserver import ForkServer
from tests.helpers.waits import follow
from tests.tiers.conftest import REPO_ROOT, key_of, meta_of, payload_of
from tiers.base import Tier

MiB = 1 << 20


def test_another_process_chunks_are_hits_and_its_removals_misses(make_tier: Callable[..., Tier]) -> None:
    """A second real process writes and removes chunks in the shared directory; this tier follows the files."""
    tier = make_tier(TierKind.PFS, 64 * MiB)
    other = subprocess.Popen([sys.executable, "-m", "tests.programs.pfs_peer", tier.root], cwd=REPO_ROOT, text=True,  # type: ignore[attr-defined]
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def ask(command: str) -> str:
        other.stdin.write(command + "\n")  # type: ignore[union-attr]
        other.stdin.flush()  # type: ignore[union-attr]
        return other.stdout.readline().strip() or other.stderr.read()  # type: ignore[union-attr]

    try:
        out = torch.empty(MiB, dtype=torch.uint8)
        assert tier.get_into(key_of(1), out) is None  # a miss first
        assert ask("put 1 300001") == "stored"
        assert tier.used_bytes == 0  # this process has not seen it yet (documented: used_bytes is our view)
        assert tier.contains(key_of(1))
        assert tier.meta(key_of(1)) == meta_of(payload_of(1, 300_001))
        assert tier.get_into(key_of(1), out) == 300_001
        assert torch.equal(out[:300_001], payload_of(1, 300_001))
        assert tier.used_bytes == tier.footprint(300_001)
        assert {key for key, _ in tier.keys()} == {key_of(1)}

        mine = payload_of(2, 10_000)
        tier.put(key_of(2), mine, meta_of(mine))
        assert ask("remove 2") == "True"
        assert not tier.contains(key_of(2))
        assert tier.get_into(key_of(2), out) is None
        assert tier.used_bytes == tier.footprint(300_001)
    finally:
        other.stdin.close()  # type: ignore[union-attr]
        other.wait(timeout=30)


def test_two_processes_writing_one_key_leave_one_whole_chunk(make_tier: Callable[..., Tier], tmp_path: Path,
                                                              fork_server: ForkServer) -> None:
    """This process and a child race puts of one key (different bytes and sizes) and read it between
    puts: every read is one whole version, and what survives is one valid chunk file."""
    tier = make_tier(TierKind.PFS, 64 * MiB)
    mine, theirs = payload_of(10, MiB // 4 + 1), payload_of(20, MiB // 2 - 4097)
    said, err = tmp_path / "racer.out", tmp_path / "racer.err"
    racer = fork_server.spawn(["-m", "tests.programs.pfs_racer", tier.root, "20", str(theirs.numel())], stdout=said,  # type: ignore[attr-defined]
                              stderr=err, cwd=REPO_ROOT)
    assert next(follow(said, racer), "").strip() == "ready", err.read_text()
    out = torch.empty(MiB, dtype=torch.uint8)
    while racer.poll() is None:
        tier.put(key_of(0), mine, meta_of(mine))
        nbytes = tier.get_into(key_of(0), out)  # never CorruptChunkError: renames publish whole files
        assert any(nbytes == p.numel() and torch.equal(out[:nbytes], p) for p in (mine, theirs))
    assert racer.wait(60) == 0, err.read_text()
    nbytes = tier.get_into(key_of(0), out)
    assert any(nbytes == p.numel() and torch.equal(out[:nbytes], p) for p in (mine, theirs))
    assert tier.used_bytes == tier.footprint(nbytes)  # type: ignore[arg-type]  # this process's view follows the survivor's size
    files = [name for _, _, names in os.walk(tier.root) for name in names]  # type: ignore[attr-defined]
    assert files == [key_of(0).hex() + ".kvc"]  # one chunk, no temp file left behind
    assert tier.num_corrupt_dropped == 0  # type: ignore[attr-defined]
