"""Factories for tier tests: one tier of any kind on tmp_path, payloads, keys, real small mounts."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash

from kvstore.errors import UnknownTierError
from kvstore.types import ChunkMeta, TierKind
from tiers.base import Tier
from tiers.registry import tier_class

REPO_ROOT = Path(__file__).resolve().parents[2]
# Every kind that can run on this machine; REDIS needs a server and has its own tests.
CONTRACT_KINDS = [kind for kind in TierKind if kind is not TierKind.REDIS]
FILE_KINDS = [TierKind.NVME, TierKind.PFS]


def key_of(i: int) -> bytes:
    return xxhash.xxh3_128_digest(f"test-chunk-{i}".encode())


def payload_of(seed: int, nbytes: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator)


def meta_of(payload: torch.Tensor, *, codec_id: int = 0, fingerprint: int = 0x1234) -> ChunkMeta:
    return ChunkMeta(codec_id=codec_id, raw_bytes=payload.numel(), stored_bytes=payload.numel(),
                     layout_fingerprint=fingerprint)


def tier_options(kind: TierKind, root: Path) -> dict:
    return {  # type: ignore[return-value]
        TierKind.HOST: {},
        TierKind.GPU: {"device": "cpu"},
        TierKind.NVME: {"path": root / "nvme", "num_workers": 2},
        TierKind.PFS: {"path": root / "pfs", "num_workers": 2},
    }[kind]


@pytest.fixture
def make_tier(tmp_path: Path) -> Iterator[Callable[..., Tier]]:
    """make_tier(kind, capacity_bytes, **overrides) -> a fresh tier; closed at teardown."""
    made: list[Tier] = []

    def factory(kind: TierKind, capacity_bytes: int, **overrides: Any) -> Tier:
        try:
            cls = tier_class(kind)
        except UnknownTierError as exc:
            pytest.skip(f"tier {kind.value!r} is not built yet (module missing): {exc}")
        tier = cls(capacity_bytes=capacity_bytes, **{**tier_options(kind, tmp_path), **overrides})
        made.append(tier)
        return tier

    yield factory
    for tier in made:
        tier.close()


def try_mount(fstype: str, target: Path, options: str | None = None) -> str | None:
    """Mount a real small filesystem at `target`; None on success, else why it cannot be done here."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return f"mounting a {fstype} needs root and mount(8)"
    target.mkdir(parents=True, exist_ok=True)
    command = ["mount", "-t", fstype, *(["-o", options] if options else []), fstype, str(target)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    return None if result.returncode == 0 else f"cannot mount a {fstype} here ({result.stderr.strip()})"


@contextmanager
def mounted(fstype: str, target: Path, options: str | None = None) -> Iterator[Path]:
    """A real small filesystem mounted at `target` for the `with` block; skips the test where impossible."""
    reason = try_mount(fstype, target, options)
    if reason is not None:
        pytest.skip(reason)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)
