"""`kvstore bench SUITE`: run one suite of bench/ and optionally write its records as JSON."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Annotated

import typer

BENCH_SUITES = ("tiers", "host", "codecs", "codec_sweep", "engine", "step_cost", "service", "cluster", "vllm",
                "serving", "async_load", "replay_speed", "adaptive_margin", "classic_noise", "lmcache", "compressed",
                "soak", "pd", "pd_tail", "lookup", "kv_events", "layouts", "chunk_memory")
# suites whose module has another name
SUITE_MODULES = {"host": "host_copy", "lmcache": "lmcache_compare", "compressed": "compressed_tiers"}
# suites that can draw their figures (`--plot PATH`); no suite writes a file that no option names
PLOTTING_SUITES = ("serving",)


def bench_command(
    suite: Annotated[str, typer.Argument(help=f"One of: {', '.join(BENCH_SUITES)}")],
    quick: Annotated[bool, typer.Option("--quick", help="Smaller sizes and fewer repeats")] = False,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the records as JSON here")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help=f"Draw the chart here (PNG; {', '.join(PLOTTING_SUITES)})")]
    = None,
) -> None:
    """Run a benchmark suite; every figure is printed beside its limit measured in the same run."""
    if suite not in BENCH_SUITES:
        raise typer.BadParameter(f"unknown suite {suite!r}; valid: {', '.join(BENCH_SUITES)}")
    if plot is not None and suite not in PLOTTING_SUITES:
        raise typer.BadParameter(f"suite {suite!r} draws no chart; --plot is for: {', '.join(PLOTTING_SUITES)}")
    try:
        module = importlib.import_module(f"bench.{SUITE_MODULES.get(suite, suite)}")
    except ModuleNotFoundError as exc:
        raise typer.BadParameter(f"suite {suite!r} is not available: {exc}") from exc
    records = module.run(quick=quick, plot=plot) if plot is not None else module.run(quick=quick)
    if json_path is not None:
        from bench.common import machine_info

        json_path.write_text(json.dumps({"suite": suite, "machine": machine_info(), "records": records}, indent=2))
        typer.echo(f"wrote {len(records)} records to {json_path}")
