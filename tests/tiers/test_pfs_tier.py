"""PFSTier: a directory shared by processes. Another process's chunk is a hit; racing writers leave one whole chunk."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

from kvstore.types import TierKind
from tests.tiers.conftest import REPO_ROOT, key_of, meta_of, payload_of, run_python

MiB = 1 << 20

_PUT_CHILD = """
import sys
from tiers.pfs import PFSTier
from tests.tiers.conftest import key_of, meta_of, payload_of
tier = PFSTier(path=sys.argv[1], capacity_bytes=1 << 30)
payload = payload_of(int(sys.argv[2]), int(sys.argv[3]))
tier.put(key_of(int(sys.argv[2])), payload, meta_of(payload))
"""

_REMOVE_CHILD = """
import sys
from tiers.pfs import PFSTier
from tests.tiers.conftest import key_of
print(PFSTier(path=sys.argv[1], capacity_bytes=1 << 30).remove(key_of(int(sys.argv[2]))))
"""


def test_chunk_written_by_another_process_is_a_hit_here(make_tier):
    tier = make_tier(TierKind.PFS, 64 * MiB)
    assert tier.get_into(key_of(1), torch.empty(MiB, dtype=torch.uint8)) is None  # a miss first
    result = run_python(_PUT_CHILD, tier.root, "1", str(300_001))
    assert result.returncode == 0, result.stderr
    assert tier.used_bytes == 0  # this process has not seen it yet (documented: used_bytes is our view)
    assert tier.contains(key_of(1))
    assert tier.meta(key_of(1)) == meta_of(payload_of(1, 300_001))
    out = torch.empty(MiB, dtype=torch.uint8)
    assert tier.get_into(key_of(1), out) == 300_001
    assert torch.equal(out[:300_001], payload_of(1, 300_001))
    assert tier.used_bytes == tier.footprint(300_001)
    assert {key for key, _ in tier.keys()} == {key_of(1)}


def test_chunk_removed_by_another_process_is_a_miss_here(make_tier):
    tier = make_tier(TierKind.PFS, 64 * MiB)
    payload = payload_of(2, 10_000)
    tier.put(key_of(2), payload, meta_of(payload))
    result = run_python(_REMOVE_CHILD, tier.root, "2")
    assert result.stdout.strip() == "True", result.stderr
    assert not tier.contains(key_of(2))
    assert tier.get_into(key_of(2), torch.empty(10_000, dtype=torch.uint8)) is None
    assert tier.used_bytes == 0


_RACER_CHILD = """
import sys
from tiers.pfs import PFSTier
from tests.tiers.conftest import key_of, meta_of, payload_of
tier = PFSTier(path=sys.argv[1], capacity_bytes=1 << 30)
payload = payload_of(int(sys.argv[2]), int(sys.argv[3]))
for _ in range(25):
    tier.put(key_of(0), payload, meta_of(payload))
"""


def test_two_processes_writing_one_key_leave_one_whole_chunk(make_tier):
    """Two writers race on one key while this process reads it: every read and the survivor are whole."""
    tier = make_tier(TierKind.PFS, 64 * MiB)
    versions = {seed: payload_of(seed, size) for seed, size in ((10, MiB // 4 + 1), (20, MiB // 2 - 4097))}
    racers = [subprocess.Popen([sys.executable, "-c", _RACER_CHILD, tier.root, str(seed), str(p.numel())],
                               cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True) for seed, p in versions.items()]
    out = torch.empty(2 * MiB, dtype=torch.uint8)
    reads = 0
    while any(racer.poll() is None for racer in racers):
        nbytes = tier.get_into(key_of(0), out)  # never CorruptChunkError: renames publish whole files
        if nbytes is not None:
            reads += 1
            assert any(nbytes == p.numel() and torch.equal(out[:nbytes], p) for p in versions.values())
        time.sleep(0.002)  # leave the 2 cores to the writers
    for racer in racers:
        assert racer.wait() == 0, racer.stderr.read()
    nbytes = tier.get_into(key_of(0), out)
    assert any(nbytes == p.numel() and torch.equal(out[:nbytes], p) for p in versions.values())
    files = [name for _, _, names in os.walk(tier.root) for name in names]
    assert files == [key_of(0).hex() + ".kvc"]  # one chunk, no temp file left behind
    assert tier.num_corrupt_dropped == 0
