"""`kvstore bench SUITE`: run one suite of bench/ and optionally write its records as JSON."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Annotated

import typer

from kvstore.errors import ConfigError

BENCH_SUITES = ("tiers", "host", "codecs", "codec_sweep", "engine", "step_cost", "service", "cluster", "vllm",
                "serving", "async_load", "replay_speed", "adaptive_margin", "classic_noise", "lmcache", "compressed",
                "soak", "pd", "pd_tail", "lookup", "kv_events", "layouts", "chunk_memory")
# suites whose module has another name
SUITE_MODULES = {"host": "host_copy", "lmcache": "lmcache_compare", "compressed": "compressed_tiers"}
# suites that can draw their figures (`--plot PATH`); no suite writes a file that no option names
PLOTTING_SUITES = ("serving",)
# suites with more than one workload (`--workload NAME`)
WORKLOAD_SUITES = ("serving",)


def bench_command(
    suite: Annotated[str, typer.Argument(help=f"One of: {', '.join(BENCH_SUITES)}")],
    quick: Annotated[bool, typer.Option("--quick", help="Smaller sizes and fewer repeats")] = False,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the records as JSON here")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help=f"Draw the chart here (PNG; {', '.join(PLOTTING_SUITES)})")]
    = None,
    workload: Annotated[str | None, typer.Option("--workload", help=f"Which workload ({', '.join(WORKLOAD_SUITES)}): "
                                                 "serving: mooncake (default) or qa (LMCache's multi-round QA)")] = None,
) -> None:
    """Run a benchmark suite; every figure is printed beside its limit measured in the same run."""
    if suite not in BENCH_SUITES:
        raise typer.BadParameter(f"unknown suite {suite!r}; valid: {', '.join(BENCH_SUITES)}")
    if plot is not None and suite not in PLOTTING_SUITES:
        raise typer.BadParameter(f"suite {suite!r} draws no chart; --plot is for: {', '.join(PLOTTING_SUITES)}")
    if workload is not None and suite not in WORKLOAD_SUITES:
        raise typer.BadParameter(f"suite {suite!r} has one workload; --workload is for: {', '.join(WORKLOAD_SUITES)}")
    try:
        module = importlib.import_module(f"bench.{SUITE_MODULES.get(suite, suite)}")
    except ModuleNotFoundError as exc:
        raise typer.BadParameter(f"suite {suite!r} is not available: {exc}") from exc
    options = {**({"plot": plot} if plot is not None else {}), **({"workload": workload} if workload is not None else {})}
    try:
        records = module.run(quick=quick, **options)
    except ConfigError as exc:  # a bad option value or size: the message names the fix
        raise typer.BadParameter(str(exc)) from exc
    if json_path is not None:
        from bench.common import machine_info

        json_path.write_text(json.dumps({"suite": suite, "machine": machine_info(), "records": records}, indent=2))
        typer.echo(f"wrote {len(records)} records to {json_path}")
