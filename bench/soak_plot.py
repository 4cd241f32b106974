"""The plot of `bench/soak.py`: the daemon's RSS over the run, the last half's fitted slope beside the limit's.

    python -m bench.soak_plot docs/bench/soak.json --out /tmp/soak.png    (from a saved run's JSON)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path


def plot_rss(samples: Sequence[tuple[float, float]], slope: float, limit: float, path: Path, title: str) -> None:
    """RSS (MiB) by minute; over the last half, the fitted line (`slope` MiB/min) and a line rising at `limit`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [t / 60 for t, _ in samples]
    rss = [m for _, m in samples]
    half = minutes[-1] / 2
    last = [(t, m) for t, m in zip(minutes, rss, strict=True) if t >= half]
    fig, axis = plt.subplots(figsize=(9, 4.5))
    axis.plot(minutes, rss, lw=1, label="daemon RSS")
    if last:
        t0, t1 = last[0][0], last[-1][0]
        mean_t = sum(t for t, _ in last) / len(last)
        mean_m = sum(m for _, m in last) / len(last)

        def at(t: float, s: float) -> float:  # a line of slope s through the last half's mean
            return mean_m + s * (t - mean_t)

        axis.plot([t0, t1], [at(t0, slope), at(t1, slope)], lw=2, label=f"last half, fitted: {slope:+.2f} MiB/min")
        axis.plot([t0, t1], [at(t0, limit), at(t1, limit)], lw=1.5, ls="--", label=f"limit: {limit:.2f} MiB/min")
        axis.axvspan(t0, t1, alpha=0.08)
    axis.set_xlabel("minutes")
    axis.set_ylabel("MiB")
    axis.set_title(title, fontsize=10)
    axis.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, help="a soak run's --json file")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    run = json.loads(args.json.read_text())
    slope = next(r for r in run["records"] if r["metric"].startswith("daemon RSS slope"))
    detail = run["detail"]
    plot_rss([tuple(s) for s in detail["rss_mib"]], slope["value"], slope["baseline_value"], args.out,
             f"soak: {detail['minutes']:g} min, host {detail['host_mib']} MiB, NVMe {detail['nvme_mib']} MiB, "
             f"{sum(detail['evictions'].values()):,} evictions")


if __name__ == "__main__":
    main()
