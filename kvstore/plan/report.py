"""Show a plan: rich tables in the terminal, the plan as JSON, and a PNG (hit rate and TTFT vs capacity)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvstore.plan.plan_record import Plan
from kvstore.units import format_bytes

logger = logging.getLogger(__name__)


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def _gbps(value: float) -> str:
    return "in place" if math.isinf(value) else f"{value:.2f}"


def print_plan(plan: Plan, console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: wide enough for the tier table
            console = Console(width=150)
    _print_header(plan, console)
    console.print(_curve_table(plan))
    console.print(_tier_table(plan))
    _print_summary(plan, console)
    console.print(_pfs_table(plan))


def _print_header(plan: Plan, console: Console) -> None:
    m, w = plan["model"], plan["workload"]
    layout = m["layout"]
    console.print(f"[bold]model[/] {m['name']}: {layout['kind']} {layout['num_layers']} layers x {layout['num_kv_heads']} "
                  f"kv heads x {layout['head_dim']}, {layout['dtype']}, codec {m['codec']} -> "
                  f"[bold]{plan['bytes_per_token']:,} B/token[/], {format_bytes(plan['bytes_per_request'])} per mean request")
    console.print(f"[bold]workload[/] {w['source']}: {w['num_requests']:,} requests over {w['duration_s']:.0f} s "
                  f"({w['rps_used']:.2f} req/s used), mean prompt {w['mean_prompt_tokens']:,.0f} tokens, "
                  f"{w['num_distinct_blocks']:,} distinct {w['block_tokens']}-token blocks of "
                  f"{format_bytes(w['block_bytes'])} ({format_bytes(w['num_distinct_blocks'] * w['block_bytes'])} in all); "
                  f"block ids: {w['block_ids']}")
    peak = max(ws["window_bytes"] for ws in plan["working_set"])
    width = plan["working_set"][0]["end_s"]
    console.print(f"[bold]working set[/]: peak {format_bytes(peak)} touched per {width:.0f} s window; "
                  f"{format_bytes(plan['working_set'][-1]['cumulative_bytes'])} over the trace")


def _curve_table(plan: Plan) -> Table:
    w = plan["workload"]
    table = Table(title=f"token hit rate against store capacity ({plan['policy']} replay, Belady MIN bound)")
    for column in ("capacity", "% of distinct", f"{plan['policy']} hit rate", "MIN hit rate", "TTFT ms"):
        table.add_column(column, justify="right")
    for p in plan["hit_rate_curve"]:
        table.add_row(format_bytes(p["capacity_bytes"]), f"{p['capacity_blocks'] / w['num_distinct_blocks'] * 100:.2f}%",
                      _pct(p["hit_rate"]), _pct(p["min_hit_rate"]), f"{p['ttft_ms']:.1f}")
    return table


def _tier_table(plan: Plan) -> Table:
    target = plan["target"]
    goal = f"hit rate {_pct(target['hit_rate'])}" if target["hit_rate"] is not None else f"TTFT {target['ttft_ms']:.0f} ms"
    table = Table(title=f"tiers for the target ({goal}), at {plan['workload']['rps_used']:.2f} req/s")
    for column in ("tier", "given", "recommended", "token share", "tier GB/s", "read GB/s", "write GB/s", "util",
                   "load wins above", "load ms/req"):
        table.add_column(column, justify="right")
    for t in plan["tiers"]:
        rec = format_bytes(t["recommended_capacity_bytes"]) + ("" if t["fits"] else " (!)")
        table.add_row(t["name"], format_bytes(t["hardware_capacity_bytes"]), rec, _pct(t["token_share"]),
                      _gbps(t["tier_gbps"]), f"{t['read_gbps']:.2f}", f"{t['write_gbps']:.2f}", _pct(t["utilization"]),
                      f"{t['breakeven_tokens']:,.0f} tok", f"{t['load_ms_mean_prompt']:.1f}")
    return table


def _print_summary(plan: Plan, console: Console) -> None:
    ttft = plan["ttft_ms"]
    busiest = max(plan["tiers"], key=lambda t: t["utilization"])
    met = "met" if plan["target_met"] else "[red]NOT reachable at any capacity[/] (the trace's reuse caps the hit rate)"
    console.print(f"[bold]target[/] {met}; planned hit rate {_pct(plan['hit_rate'])} "
                  f"(all given hardware: {_pct(plan['hardware_hit_rate'])})")
    console.print(f"[bold]mean TTFT[/] (prefill, no queueing): recompute all {ttft['recompute_all']:.1f} ms, GPU prefix cache only "
                  f"{ttft['without_store']:.1f} ms, with the planned store {ttft['with_store']:.1f} ms, "
                  f"with all given hardware {ttft['with_store_full_hardware']:.1f} ms")
    console.print(f"[bold]busiest tier[/]: {busiest['name']} at {_pct(busiest['utilization'])} of its bandwidth")
    memory = plan["host_memory"]
    fits = "" if memory["fits"] else " [red](!) more than the host memory given[/]"
    console.print(f"[bold]host memory[/]: {format_bytes(memory['total_bytes'])} = host tier "
                  f"{format_bytes(memory['host_tier_bytes'])} + the daemon's per-chunk state "
                  f"{format_bytes(memory['daemon_chunk_state_bytes'])} "
                  f"({memory['daemon_bytes_per_disk_chunk']} B per chunk on disk, {plan['policy']} policy){fits}")
    if any(not t["fits"] for t in plan["tiers"]):
        console.print("[yellow](!) the recommendation exceeds the capacity given for that tier[/]")


def _pfs_table(plan: Plan) -> Table:
    table = Table(title="shared PFS: per-node gain as nodes grow (all given hardware)")
    for column in ("nodes", "PFS GB/s per node", "TTFT gain per node ms", "aggregate PFS read GB/s", "PFS GB/s"):
        table.add_column(column, justify="right")
    for row in plan["pfs_scaling"]:
        table.add_row(str(row["nodes"]), f"{row['pfs_gbps_per_node']:.2f}", f"{row['gain_ms_per_node']:.2f}",
                      f"{row['aggregate_demand_gbps']:.2f}", f"{row['pfs_gbps']:.0f}")
    return table


def write_json(plan: Plan, path: Path) -> None:
    """The plan as JSON (infinite bandwidths as null)."""
    def clean(value: object) -> object:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    path.write_text(json.dumps(clean(plan), indent=2))


def write_plot(plan: Plan, path: Path) -> None:
    """Two panels against store capacity: token hit rate (policy, MIN) and TTFT; tier sizes marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = plan["hit_rate_curve"]
    gib = [p["capacity_bytes"] / 2**30 for p in curve]
    fig, (ax_hit, ax_ttft) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax_hit.plot(gib, [p["hit_rate"] * 100 for p in curve], "o-", label=f"{plan['policy']} (replay)")
    ax_hit.plot(gib, [p["min_hit_rate"] * 100 for p in curve], "s--", label="Belady MIN (bound)")
    ax_hit.set_ylabel("token hit rate (%)")
    ax_ttft.plot(gib, [p["ttft_ms"] for p in curve], "o-", label="with the store")
    ax_ttft.axhline(plan["ttft_ms"]["without_store"], color="gray", linestyle=":", label="GPU prefix cache only")
    ax_ttft.axhline(plan["ttft_ms"]["recompute_all"], color="firebrick", linestyle=":", label="recompute everything")
    ax_ttft.set_ylabel("predicted mean TTFT (ms)")
    for ax in (ax_hit, ax_ttft):
        for tier in plan["tiers"]:
            if 0 < tier["hardware_capacity_bytes"] <= curve[-1]["capacity_bytes"] * 4:
                ax.axvline(tier["hardware_capacity_bytes"] / 2**30, color="lightgray", linewidth=1)
                ax.text(tier["hardware_capacity_bytes"] / 2**30, ax.get_ylim()[1], tier["name"], fontsize=8, va="top")
        ax.set_xscale("log")
        ax.set_xlabel("store capacity (GiB)")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(f"{plan['model']['name']} on {plan['workload']['source']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
