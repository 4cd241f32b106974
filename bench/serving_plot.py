"""The plot of `kvstore bench serving`: TTFT (mean, p50, p90, p99) and TPOT per run, side by side (matplotlib)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

TTFT_FIGURES = ("ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99")


def plot_runs(results: dict[str, dict[str, float]], runs: Sequence[str], path: Path, title: str) -> None:
    """Grouped bars: the multi-turn sessions' TTFT and TPOT, and `vllm bench serve`'s TTFT where it ran (--quick),
    one bar per run; the legend beside the panels, the title wrapped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("multi-turn sessions: TTFT (s)", TTFT_FIGURES, 4.0), ("multi-turn sessions: TPOT (s)", ("tpot_mean",), 1.4)]
    if any(f"bench_serve.{TTFT_FIGURES[0]}" in results[run] for run in runs):
        panels.append(("vllm bench serve, prefix repetition: TTFT (s)",
                       tuple(f"bench_serve.{f}" for f in TTFT_FIGURES), 4.0))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 + 2.6 * sum(p[2] for p in panels), 5.2),
                             gridspec_kw={"width_ratios": [p[2] for p in panels]})
    width = 0.8 / len(runs)
    for axis, (label, figures, _) in zip(axes, panels, strict=True):
        for i, run in enumerate(runs):
            values = [results[run].get(f, 0.0) for f in figures]
            axis.bar([x + i * width for x in range(len(figures))], values, width, label=run)
        axis.set_xticks([x + width * (len(runs) - 1) / 2 for x in range(len(figures))])
        axis.set_xticklabels([f.removeprefix("bench_serve.").replace("_", " ") for f in figures])
        axis.set_title(label, fontsize=10)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=9)
    fig.suptitle("\n".join(textwrap.wrap(title, 150)), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"plot: {path}")
