"""The plot of `kvstore bench serving`: TTFT (mean, p50, p90, p99) and TPOT per run, side by side (matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

TTFT_FIGURES = ("ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99")


def plot_runs(results: dict[str, dict[str, float]], runs: Sequence[str], path: Path, title: str) -> None:
    """Grouped bars: the multi-turn sessions' TTFT and TPOT, and `vllm bench serve`'s TTFT, one bar per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("multi-turn sessions: TTFT (s)", TTFT_FIGURES), ("multi-turn sessions: TPOT (s)", ("tpot_mean",)),
              ("vllm bench serve, prefix repetition: TTFT (s)", tuple(f"bench_serve.{f}" for f in TTFT_FIGURES))]
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.5), gridspec_kw={"width_ratios": [4, 1.4, 4]})
    width = 0.8 / len(runs)
    for axis, (label, figures) in zip(axes, panels, strict=True):
        for i, run in enumerate(runs):
            values = [results[run].get(f, 0.0) for f in figures]
            axis.bar([x + i * width for x in range(len(figures))], values, width, label=run)
        axis.set_xticks([x + width * (len(runs) - 1) / 2 for x in range(len(figures))])
        axis.set_xticklabels([f.removeprefix("bench_serve.").replace("_", " ") for f in figures])
        axis.set_title(label, fontsize=10)
    axes[0].legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")
