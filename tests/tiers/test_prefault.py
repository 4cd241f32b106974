"""`touch_pages`: every byte of the arena is zeroed, and a large arena shows a progress line."""

from __future__ import annotations

import pytest
import torch

from tiers import prefault


def test_large_arena_is_touched_with_a_progress_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(prefault, "PROGRESS_FROM_BYTES", 1 << 20)  # "large" scaled down to keep the test small
    monkeypatch.setattr(prefault, "STEP_BYTES", 1 << 18)
    arena = torch.full((3 << 20,), 7, dtype=torch.uint8)
    prefault.touch_pages(arena, "host tier")
    assert int(arena.count_nonzero()) == 0
    err = capsys.readouterr().err
    assert "host tier: touching memory" in err and "3.0 MiB" in err


def test_small_arena_is_touched_silently(capsys: pytest.CaptureFixture[str]) -> None:
    arena = torch.full((1 << 16,), 7, dtype=torch.uint8)
    prefault.touch_pages(arena, "host tier")
    assert int(arena.count_nonzero()) == 0 and capsys.readouterr().err == ""
