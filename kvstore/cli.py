"""The `kvstore` command: serve | plan | replay | bench | stats | demo (heavy imports are lazy)."""

from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Tiered KV-cache store for LLM serving (GPU, host, NVMe, PFS, Redis).")

BENCH_SUITES = ("tiers", "codecs", "engine", "step_cost", "service", "cluster", "replay_speed")


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level")] = False) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@app.command()
def bench(
    suite: Annotated[str, typer.Argument(help=f"One of: {', '.join(BENCH_SUITES)}")],
    quick: Annotated[bool, typer.Option("--quick", help="Smaller sizes and fewer repeats")] = False,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the records as JSON here")] = None,
) -> None:
    """Run a benchmark suite; every figure is printed beside its limit measured in the same run."""
    if suite not in BENCH_SUITES:
        raise typer.BadParameter(f"unknown suite {suite!r}; valid: {', '.join(BENCH_SUITES)}")
    try:
        module = importlib.import_module(f"bench.{suite}")
    except ModuleNotFoundError as exc:
        raise typer.BadParameter(f"suite {suite!r} is not available: {exc}") from exc
    records = module.run(quick=quick)
    if json_path is not None:
        from bench.common import machine_info

        json_path.write_text(json.dumps({"suite": suite, "machine": machine_info(), "records": records}, indent=2))
        typer.echo(f"wrote {len(records)} records to {json_path}")


@app.command()
def stats(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML/YAML store config")] = None,
) -> None:
    """Open the configured store (rebuilding its index from disk) and print its stats."""
    from kvstore.config import load_config
    from kvstore.store import TieredStore

    with TieredStore(load_config(config)) as store:
        typer.echo(json.dumps(store.stats(), indent=2))


@app.command("store-demo")
def store_demo(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML/YAML store config")] = None,
    prompt_tokens: Annotated[int, typer.Option(help="Length of the long prompt")] = 8192,
) -> None:
    """Store a long prompt's KV, drop the host copies, reload it from disk, and show what happened."""
    from kvstore.demo_store import run_store_demo

    run_store_demo(config, prompt_tokens)


# REGISTER-COMMANDS (helpers add `app.command(...)(fn)` lines below this marker)
app.command("replay", context_settings={"allow_extra_args": True})(importlib.import_module("kvstore.replay_cli").replay_command)
app.command("plan")(importlib.import_module("kvstore.plan_cli").plan_command)
app.command("serve")(importlib.import_module("service.daemon").serve_command)  # cheap: uvicorn loads on run
app.command("demo")(importlib.import_module("kvstore.demo_engine").demo_command)
