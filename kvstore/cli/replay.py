"""`kvstore replay`: replay a trace through eviction policies; table, JSON and plot.

TRACE is a Mooncake JSONL (prefix block ids), an Azure CSV (block ids from the planner's stated
reuse model, kvstore/sim/trace_files.py), or a bundled trace's name (kvstore/bundled.py:
`mooncake-sample`, `azure-sample`).
"""

from __future__ import annotations

import json as jsonlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from kvstore.sim.replay import ReplayResult
    from kvstore.sim.trace import Trace

logger = logging.getLogger(__name__)

DEFAULT_CAPACITIES = [1.0, 5.0, 10.0]


def default_policies() -> list[str]:
    """Every eviction policy a replay runs, the tier policies and the replay-only ones (`min` last, as the bound)."""
    from kvstore.sim.eviction import replay_policy_names

    names = [n for n in replay_policy_names() if n != "min"]
    return [*names, "min"]


def replay_command(
    ctx: typer.Context,
    trace: Annotated[str, typer.Argument(help="Mooncake JSONL (timestamp, input_length, hash_ids), Azure CSV, a "
                                         "bundled trace (mooncake-sample, azure-sample), gen:FAMILY[:SEED] (chat, "
                                         "agent, rag, scan, mix), a suite member name, or `suite` for the whole suite")],
    policy: Annotated[list[str] | None, typer.Option("--policy", "-p", help="eviction policy, or EVICT+ADMISSION (e.g. lru+ghost); repeat; default: every tier policy, the replay-only pace, and min")] = None,
    capacity: Annotated[list[float] | None, typer.Option("--capacity", "-c", help="capacity, % of the trace's distinct blocks; repeat; default 1 5 10")] = None,
    json: Annotated[Path | None, typer.Option("--json", help="write the records as a JSON list")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="write hit rate against capacity as PNG")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="replay only the first N requests")] = None,
    processes: Annotated[int | None, typer.Option("--processes", help="worker processes (default: CPU count)")] = None,
    nodes: Annotated[list[int] | None, typer.Option("--nodes", help="simulate routing over N nodes (repeat: --nodes 4 --nodes 8)")] = None,
    routing: Annotated[list[str] | None, typer.Option("--routing", help="with --nodes: cache-aware, cache-aware-balanced, round-robin, first-block-hash; repeat; default all")] = None,
    sessions: Annotated[int, typer.Option(help="Azure CSV reuse model: conversations")] = 200,
    repeat_share: Annotated[float, typer.Option(help="Azure CSV reuse model: share of a prompt its conversation's previous request had")] = 0.5,
    traces: Annotated[Path | None, typer.Option("--traces", help="folder with the suite's trace files (mooncake_conversation.jsonl, azure_*_2023.csv)")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="with `suite`: write the per-family table and the target checks as Markdown")] = None,
) -> None:
    """Replay TRACE through each policy at each capacity; Belady's MIN is the bound.

    `--policy lru arc min --capacity 1 5 10` works as well as repeating the options: extra
    values that parse as numbers are capacities, the others policy names.
    """
    from kvstore.sim.replay import replay_many

    policy, capacity = _with_extra_values(policy, capacity, list(getattr(ctx, "args", []) or []))
    if trace == "suite":  # every workload of kvstore/sim/suite.py
        _suite(policy, capacity, traces=traces, json_path=json, plot_path=plot, markdown_path=markdown,
               processes=processes)
        return
    start = time.perf_counter()
    loaded = load_replay_trace(trace, limit=limit, trace_dir=traces, sessions=sessions, repeat_share=repeat_share)
    if nodes:  # routing simulation (kvstore/sim/route_sim.py); --capacity is per node, default 5
        from kvstore.sim.route_sim import run_routing_replay

        run_routing_replay(loaded, nodes, routing, capacity)
        return
    policies = list(policy) if policy else default_policies()
    capacities = list(capacity) if capacity else DEFAULT_CAPACITIES
    results = replay_many(loaded, policies, capacities, processes=processes)
    wall_s = time.perf_counter() - start
    _print_table(results, loaded.num_accesses, loaded.num_distinct_blocks, wall_s)
    if json is not None:
        json.write_text(jsonlib.dumps([r.to_record() for r in results], indent=2) + "\n")
        typer.echo(f"wrote {len(results)} records to {json}")
    if plot is not None:
        write_plot(results, plot)
        typer.echo(f"wrote plot to {plot}")


def _suite(policy: list[str] | None, capacity: list[float] | None, *, traces: Path | None, json_path: Path | None,
           plot_path: Path | None, markdown_path: Path | None, processes: int | None) -> None:
    """`kvstore replay suite`: every workload, the target checks; exit 1 when one fails."""
    from kvstore.sim.suite_cli import run_suite, suite_markdown

    records = run_suite(policy or None, capacity or None, traces=traces, json_path=json_path, plot_path=plot_path,
                        markdown_path=markdown_path, processes=processes)
    failed = [line for line in suite_markdown(records).splitlines() if line.startswith("- FAIL")]
    if failed:
        typer.echo(f"kvstore replay suite: {len(failed)} check(s) failed (the FAIL lines above)", err=True)
        raise typer.Exit(1)


def load_replay_trace(trace: str, *, limit: int | None, trace_dir: Path | None, sessions: int,
                      repeat_share: float) -> Trace:
    """The trace TRACE names (kvstore/sim/suite.py); bad input is a usage error naming the problem."""
    from kvstore.errors import KVStoreError
    from kvstore.sim import suite
    from kvstore.sim.trace_files import AZURE_REUSE_MODEL

    try:
        loaded = suite.load_replay_trace(trace, limit=limit, trace_dir=trace_dir, sessions=sessions,
                                         repeat_share=repeat_share)
    except KVStoreError as exc:
        raise typer.BadParameter(str(exc), param_hint="TRACE") from None
    if trace.lower().endswith(".csv") or trace in ("azure-sample", "azure-conv", "azure-code"):
        typer.echo("block ids: " + AZURE_REUSE_MODEL.format(sessions=sessions, repeat_share=repeat_share,
                                                            block_tokens=suite.BLOCK_TOKENS))
    return loaded


def _with_extra_values(policy: list[str] | None, capacity: list[float] | None,
                       extra: list[str]) -> tuple[list[str] | None, list[float] | None]:
    for value in extra:
        try:
            capacity = [*(capacity or []), float(value)]
        except ValueError:
            if value.startswith("-"):
                raise typer.BadParameter(f"unknown option {value!r}; see kvstore replay --help") from None
            policy = [*(policy or []), value]
    return policy, capacity


def _print_table(results: list[ReplayResult], accesses: int, distinct: int, wall_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    bound = {r.capacity_pct: r.block_hit_rate for r in results if r.policy == "min"}
    table = Table(title=f"{results[0].trace if results else ''}: {accesses:,} block accesses, {distinct:,} distinct blocks")
    for column in ("policy", "capacity", "blocks", "block hit", "prefix hit", "token hit", "x MIN", "blocks/s"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for r in results:
        ratio = f"{r.block_hit_rate / bound[r.capacity_pct]:.2f}" if bound.get(r.capacity_pct) else "-"
        table.add_row(r.policy, f"{r.capacity_pct:g}%", f"{r.capacity_blocks:,}", f"{r.block_hit_rate:.1%}",
                      f"{r.prefix_hit_rate:.1%}", f"{r.token_hit_rate:.1%}", ratio, f"{r.blocks_per_s:,.0f}")
    console = Console()
    console.print(table)
    console.print(f"{len(results)} replays in {wall_s:.1f} s (load + replay)")


def write_plot(results: list[ReplayResult], path: Path) -> None:
    """Block hit rate against capacity, one line per policy (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r.policy for r in results):
        points = sorted((r.capacity_pct, r.block_hit_rate * 100) for r in results if r.policy == name)
        style = "k--" if name == "min" else "-o"
        ax.plot([p[0] for p in points], [p[1] for p in points], style, label=name)
    ax.set_xscale("log")
    ticks = sorted({r.capacity_pct for r in results})
    ax.set_xticks(ticks, [f"{t:g}%" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("capacity (% of distinct blocks)")
    ax.set_ylabel("block hit rate (%)")
    ax.set_title(results[0].trace if results else "replay")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
