"""The README's headline chart: vLLM's time to first token with a prefix in kvstore, from `kvstore bench vllm`.

    .venv/bin/python -m bench.headline_chart [--json docs/bench/vllm.json] [--out docs/headline_vllm_ttft.png]

Reads the records of one `kvstore bench vllm --json` run and draws each TTFT beside the recomputed one
of the same run (bars, with the ratio written on each); nothing is measured here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BARS = (("vllm.ttft.host", "kvstore, host RAM"), ("vllm.ttft.nvme", "kvstore, NVMe (daemon restarted)"),
        ("vllm.ttft.vllm_prefix_cache", "vLLM's own prefix cache (same engine)"))


def draw(records: list[dict], out: Path) -> None:
    """Bars of TTFT (s): recompute first, then each cached path, labelled with its speed-up."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_metric = {r["metric"]: r for r in records}
    recompute = by_metric[BARS[0][0]]["baseline_value"]
    labels = ["recompute (no store)", *(label for _, label in BARS)]
    values = [recompute, *(by_metric[metric]["value"] for metric, _ in BARS)]
    fig, ax = plt.subplots(figsize=(7.5, 2.6))
    bars = ax.barh(labels[::-1], values[::-1], color=["#999999", "#4c72b0", "#55a868", "#c44e52"][::-1])
    for bar, value in zip(bars, values[::-1]):
        note = f"{value:.2f} s" + ("" if value == recompute else f"  ({recompute / value:.1f}x faster)")
        ax.text(bar.get_width() + recompute * 0.01, bar.get_y() + bar.get_height() / 2, note, va="center", fontsize=9)
    ax.set_xlim(0, recompute * 1.45)
    ax.set_xlabel("time to first token, 2k-token prefix + 32 new tokens (s)")
    ax.set_title("vLLM 0.32 on CPU, 4-layer Llama: where the prefix comes from", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=Path("docs/bench/vllm.json"))
    parser.add_argument("--out", type=Path, default=Path("docs/headline_vllm_ttft.png"))
    args = parser.parse_args()
    draw(json.loads(args.json.read_text())["records"], args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
