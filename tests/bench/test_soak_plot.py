"""The soak's plot: drawn from a run's samples, and from a saved run's JSON as its docstring says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.soak_plot import plot_rss

REPO = Path(__file__).resolve().parents[2]


def test_the_rss_plot_is_a_png_drawn_from_the_samples(tmp_path: Path) -> None:
    samples = [(5.0 * i, 340.0 + min(i, 24) + (i % 7) * 0.3) for i in range(720)]  # an hour: a rise, then flat
    out = tmp_path / "plots" / "soak.png"
    plot_rss(samples, 0.01, 0.5, out, "soak")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_the_plot_is_drawn_from_the_recorded_run(tmp_path: Path) -> None:
    out = tmp_path / "soak.png"
    subprocess.run([sys.executable, "-m", "bench.soak_plot", str(REPO / "docs/bench/soak.json"), "--out", str(out)],
                   cwd=REPO, check=True, capture_output=True, timeout=120)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
