"""`kvstore demo`: the engine demo's command line (the engine and torch load only when it runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def demo_command(
    num_requests: Annotated[int, typer.Option("--requests", "-n", help="Requests taken from the trace")] = 48,
    requests_per_s: Annotated[float, typer.Option("--rate", help="Mean arrival rate after scaling")] = 3.0,
    num_blocks: Annotated[int, typer.Option("--pages", help="Engine KV pages (16 tokens each); fewer than the "
                                                         "workload's prefixes need, as on a busy GPU")] = 256,
    trace: Annotated[Path | None, typer.Option("--trace", help="Azure conversation CSV (default: ../shared/traces/azure_conv_2023.csv, "
                                                               "else the 500-row slice shipped with kvstore)")] = None,
    store_dir: Annotated[Path | None, typer.Option("--store-dir", help="Store root (default: a temp dir)")] = None,
    embedded: Annotated[bool, typer.Option("--embedded", help="Use an in-process store instead of a "
                                                              "`kvstore serve` sidecar")] = False,
    threads: Annotated[int, typer.Option("--threads", help="torch CPU threads for the model (1 is steadiest "
                                                           "when other work shares the cores)")] = 1,
    rounds: Annotated[int, typer.Option("--rounds", help="Repeat the three passes, each round on a fresh store; "
                                                         "the table shows the median and the range")] = 3,
) -> None:
    """Replay an Azure conversation workload through the engine, with and without the store."""
    import torch
    from rich.console import Console

    from kvstore.cli.demo_run import print_results, run_engine_demo

    torch.set_num_threads(threads)
    console = Console()
    results = run_engine_demo(num_requests=num_requests, requests_per_s=requests_per_s, num_blocks=num_blocks,
                              trace=trace, store_dir=store_dir, console=console, sidecar=not embedded,
                              rounds=rounds)
    print_results(results, console)
