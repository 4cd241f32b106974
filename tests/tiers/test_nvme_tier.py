"""NVMeTier: recovery from the chunk headers, SIGKILL mid-write, the kvikio choice and its log line."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.errors import ConfigError
from kvstore.types import TierKind
from tests.helpers.forkserver import ForkServer
from tests.helpers.waits import follow
from tests.programs.nvme_writer import killed_payload
from tests.tiers.conftest import key_of, meta_of, payload_of
from tiers import file_io
from tiers.base import Tier
from tiers.nvme import NVMeTier, _load_kvikio

MiB = 1 << 20
KVIKIO_USABLE = _load_kvikio()[0] is not None


def test_new_tier_over_the_same_directory_recovers_keys_and_bytes(make_tier: Callable[..., Tier]) -> None:
    first = make_tier(TierKind.NVME, 64 * MiB)
    payloads = {key_of(i): payload_of(i, 50_000 * (i + 1)) for i in range(5)}
    for key, payload in payloads.items():
        first.put(key, payload, meta_of(payload, codec_id=i_codec(key)))
    first.close()

    second = make_tier(TierKind.NVME, 64 * MiB)  # same tmp_path/nvme directory
    assert second.used_bytes == first.used_bytes == sum(second.footprint(p.numel()) for p in payloads.values())
    assert all(second.contains(key) for key in payloads)  # scanned on first use, before any keys() call
    assert dict(second.keys()) == {key: meta_of(p, codec_id=i_codec(key)) for key, p in payloads.items()}
    out = torch.empty(MiB, dtype=torch.uint8)
    for key, payload in payloads.items():
        assert second.get_into(key, out) == payload.numel() and torch.equal(out[: payload.numel()], payload)


def i_codec(key: bytes) -> int:
    return key[0] % 3


def _wait_for_a_write_in_flight(root: Any, attempts: int = 20_000) -> None:
    """Return as soon as a temp file exists (a put between open and rename), so the kill lands mid-write."""
    for _ in range(attempts):
        if any(name.endswith(".tmp") for _, _, names in os.walk(root) for name in names):
            return


def test_sigkill_mid_writes_leaves_only_complete_chunks(tmp_path: Path, fork_server: ForkServer) -> None:
    """Two threads write 1-3 MiB chunks until SIGKILL; a new tier sees every acknowledged chunk, whole."""
    root = tmp_path / "killed"
    out = tmp_path / "writer.out"
    child = fork_server.spawn(["-m", "tests.programs.nvme_writer", str(root)], stdout=out, stderr=tmp_path / "writer.err")
    acked: list[int] = []
    lines = follow(out, child)
    try:
        while len(acked) < 40:
            line = next(lines, "")
            assert line, f"writer died early: {(tmp_path / 'writer.err').read_text()}"
            acked.append(int(line))
        _wait_for_a_write_in_flight(root)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    # the writer went on after the 40th line until the kill: every line it printed is an acknowledged put
    text = out.read_text()
    acked = [int(line) for line in text[: text.rfind("\n") + 1].split()]
    tier = NVMeTier(path=root, capacity_bytes=1 << 40)
    visible = dict(tier.keys())
    assert tier.num_corrupt_dropped == 0  # rename publishes whole files only: nothing torn to drop
    buf = file_io.aligned_empty(4 * MiB)
    candidates = {key_of(i): i for i in range(max(acked) + 4)}  # beyond: one put in flight per thread
    assert set(visible) <= set(candidates)
    for key in visible:
        payload = killed_payload(candidates[key])
        assert tier.get_into(key, buf) == payload.numel() and torch.equal(buf[: payload.numel()], payload)
    assert {key_of(i) for i in acked} <= set(visible)
    leftovers = [name for _, _, names in os.walk(root) for name in names if name.endswith(".tmp")]
    assert leftovers == []  # the interrupted writes' temp files predate this tier: the scan removed them
    tier.close()


@pytest.mark.skipif(KVIKIO_USABLE, reason="kvikio and the CUDA driver are present here")
def test_without_kvikio_one_info_line_names_the_posix_path(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tiers.nvme"):
        tier = NVMeTier(path=tmp_path / "n", capacity_bytes=MiB)
    lines = [r.getMessage() for r in caplog.records if r.name == "tiers.nvme"]
    assert len(lines) == 1 and lines[0].startswith("kvikio unavailable (") and "POSIX O_DIRECT" in lines[0]
    assert not tier.uses_kvikio
    with pytest.raises(ConfigError, match="kvikio is unavailable"):
        NVMeTier(path=tmp_path / "n", capacity_bytes=MiB, use_kvikio=True)
    tier.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_round_trip(tmp_path: Path) -> None:
    """On a GPU machine: device payloads and outputs (through kvikio when it is installed)."""
    tier = NVMeTier(path=tmp_path / "gpu", capacity_bytes=256 * MiB)
    payload = payload_of(1, 3 * MiB + 11).cuda()
    tier.put(key_of(1), payload, meta_of(payload))
    out = torch.zeros(4 * MiB, dtype=torch.uint8, device="cuda")
    assert tier.get_into(key_of(1), out) == payload.numel()
    assert torch.equal(out[: payload.numel()], payload)
    host_out = torch.empty(4 * MiB, dtype=torch.uint8)
    assert tier.get_into(key_of(1), host_out) == payload.numel()
    assert torch.equal(host_out[: payload.numel()], payload.cpu())
    tier.close()
